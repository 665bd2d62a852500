"""The run's lifecycle: the run built once (`built.py`), preflight, launch, resume, the roles it
starts and the lock that makes one owner."""
