"""The run's Redis: its server (`server.py`), how clients connect and probe it, the one list of
key and stream names (`names.py`) and the versioned JSON codec of its messages (`codec.py`).
Refuses RL maths, the journal's semantics and restart policy (`rlrun.journal`, `rlrun.supervisor`).
"""
