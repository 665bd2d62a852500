"""The per-sample token journal: append, read back, replay plan, exactly-once delivery marks.

The actor appends every sample's tokens, their sampled-token logprobs and the policy version
that produced them to the journal in Redis as they stream in; a group is published to the
trainer's stream and marked delivered in one atomic step. After any restart the journal's open
groups are read back and `plan_replay` (a pure function) says which samples to keep, continue
from their exact prefix, finish, or restart. This package knows nothing about HTTP or vLLM.
"""

from rlrun.journal.plan import Action, GroupPlan, ReplayCounters, ReplayPlan, SamplePlan, plan_replay
from rlrun.journal.records import CorruptRecord, GroupHeader, GroupRecord, LogEntry, SampleRecord
from rlrun.journal.store import (
    Append,
    CursorConflict,
    Journal,
    JournalError,
    LoadResult,
    NotFinished,
    UnknownGroup,
    WriteResult,
)

__all__ = [
    "Action", "Append", "CorruptRecord", "CursorConflict", "GroupHeader", "GroupPlan",
    "GroupRecord", "Journal", "JournalError", "LoadResult", "LogEntry", "NotFinished",
    "ReplayCounters", "ReplayPlan", "SamplePlan", "SampleRecord", "UnknownGroup", "WriteResult",
    "plan_replay",
]
