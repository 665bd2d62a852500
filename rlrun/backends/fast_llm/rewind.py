"""Exactly-once documents under Fast-LLM: before every (re)start, the consumer group is set back to
the first document the trainer's checkpoint does not cover (`documents_seen`: `XGROUP SETID ...
ENTRIESREAD n`), so the rest are delivered again, none twice. Without `documents_seen` what was
read after the checkpoint is reported as lost. Limits: docs/operations.md ("Exactly-once documents").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rlrun.backends.fast_llm.checkpoints import CheckpointMetadata

_CHUNK = 10_000  # stream entries read per XRANGE while looking for the rewind point


@dataclass(frozen=True)
class Rewind:
    checkpoint_step: Optional[int]  # the checkpoint the trainer restarts from (None: from the base model)
    documents_seen: Optional[int]  # documents that checkpoint covers (None: not recorded by this Fast-LLM)
    delivered_before: Optional[int]  # documents the group had handed out before the rewind (None: unknown)
    redelivered: int  # read by the previous trainer after its checkpoint: delivered again
    lost: Optional[int]  # read after the checkpoint and not delivered again (None: cannot be told)
    position: str  # the group's last-delivered id after the rewind


def rewind_group(client, stream: str, group: str, checkpoint: Optional[CheckpointMetadata]) -> Rewind:
    """Set `group` on `stream` back to the first document `checkpoint` does not cover (creating
    both at the start when they do not exist yet) and say what that did."""
    step = None if checkpoint is None else checkpoint.completed_steps
    target = 0 if checkpoint is None else checkpoint.documents_seen  # already trained; None: not recorded
    info = _group_info(client, stream, group)
    delivered = None if info is None else info.get("entries-read")
    if info is None:
        client.xgroup_create(stream, group, id="0", mkstream=True)
        delivered = 0
    if target is None:  # not rewound: whatever was read after the checkpoint is lost
        position = info.get("last-delivered-id", "0-0") if info else "0-0"
        return Rewind(step, None, delivered, 0, None, str(position))
    position = _id_of_entry(client, stream, target)
    if position is None:
        raise RuntimeError(
            f"the checkpoint of step {step} covers {target} documents but {stream} holds fewer: the stream was "
            "trimmed or belongs to another run"
        )
    client.xgroup_setid(stream, group, position, entries_read=target)
    if delivered is None:  # (redelivered, lost) cannot be told
        return Rewind(step, target, None, 0, None, position)
    return Rewind(step, target, delivered, max(0, delivered - target), 0, position)


def _group_info(client, stream: str, group: str) -> Optional[dict]:
    if not client.exists(stream):
        return None
    for entry in client.xinfo_groups(stream):
        if entry.get("name") == group:
            return entry
    return None


def _id_of_entry(client, stream: str, n: int) -> Optional[str]:
    """The id of the stream's n-th entry (1-based), "0-0" for n = 0, None when it has fewer."""
    if n == 0:
        return "0-0"
    start, seen = "-", 0
    while True:
        entries = client.xrange(stream, min=start, count=min(_CHUNK, n - seen))
        if not entries:
            return None
        seen += len(entries)
        if seen == n:
            return entries[-1][0]
        start = "(" + entries[-1][0]
