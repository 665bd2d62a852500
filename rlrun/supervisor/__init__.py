"""Process supervision: specs in, ordered start, watching, orderly stop, no orphans.

Knows nothing about RL, Redis streams, vLLM, torch or Ray: roles hand it process specs and a
completion check.
"""

from rlrun.supervisor.events import EventLog
from rlrun.supervisor.spec import ProcessSpec, ProcessState
from rlrun.supervisor.stall import ProgressWatch
from rlrun.supervisor.supervisor import ProcessStatus, RunVerdict, Supervisor, supervised

__all__ = [
    "EventLog",
    "ProcessSpec",
    "ProcessState",
    "ProcessStatus",
    "ProgressWatch",
    "RunVerdict",
    "Supervisor",
    "supervised",
]
