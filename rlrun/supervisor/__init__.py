"""Process supervision: specs in, ordered start, watching, orderly stop, no orphans.

Knows nothing about RL, Redis streams, vLLM, torch or Ray: roles hand it process specs and a
completion predicate.
"""

from rlrun.supervisor.events import EventLog
from rlrun.supervisor.spec import ProcessSpec, ProcessState
from rlrun.supervisor.supervisor import ExitRejected, ProcessStatus, Supervisor

__all__ = ["EventLog", "ExitRejected", "ProcessSpec", "ProcessState", "ProcessStatus", "Supervisor"]
