"""The run's lifecycle: preflight, launch, resume, the roles it starts and the lock that makes one owner."""
