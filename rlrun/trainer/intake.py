"""The hf trainer's input: whole groups read from the actors' streams through its consumer group,
and where each stream stands — what a checkpoint covers and what the actors' back-pressure counts.

A checkpoint records, per stream, the last entry the steps it covers read and how many entries
that is (`Position`). A trainer (re)started from a checkpoint sets its consumer group back there
(`XGROUP SETID ... ENTRIESREAD n`), whatever Redis says was read or acknowledged since: the
entries after it, and only those, are read again, in order. A fallback past a damaged newer
checkpoint therefore trains again what that checkpoint had acknowledged (without the rewind
those groups were never read again: the trainer starved while the actors, counting them as
outstanding, waited for it — the deadlock of issue 26).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

log = logging.getLogger(__name__)

START = "0-0"  # before the first entry of a stream


@dataclass(frozen=True)
class Position:
    """Where the trainer stands in one stream: the last entry read for a step it took, and how
    many entries the stream holds up to and including it (every one of them read: in order)."""

    last_id: str = START
    entries_read: int = 0

    def to_json(self) -> list:
        return [self.last_id, self.entries_read]

    @classmethod
    def from_json(cls, value) -> "Position":
        ok = (
            isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str) and type(value[1]) is int
        )
        if not ok or value[1] < 0:
            raise ValueError(f"a stream position is [last entry id, entries read >= 0], got {value!r}")
        return cls(value[0], value[1])


def before(stream_id: str) -> str:
    """The largest stream id below `stream_id` ("5-0" → "4-18446744073709551615")."""
    ms_text, _, seq_text = stream_id.partition("-")
    ms, seq = int(ms_text), int(seq_text or 0)
    if seq > 0:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{2**64 - 1}" if ms > 0 else START


class GroupIntake:
    """Rank 0's reader of the streams `streams` as consumer group `group`. `rewind` first; then
    `read` a step's messages; `positions` is what the steps read so far cover."""

    def __init__(self, redis, streams: list[str], group: str, consumer: str = "trainer") -> None:
        self.redis, self.streams, self.group, self.consumer = redis, list(streams), group, consumer
        self.positions: dict[str, Position] = {stream: Position() for stream in self.streams}
        self._turn = 0  # the stream read first next time, so no actor's groups wait behind another's

    def rewind(self, covered: Optional[dict[str, Position]]) -> dict[str, Position]:
        """Set the group back to what the checkpoint loaded covers (`covered`; {} for the base
        model: the start of every stream; None: a checkpoint written before positions were
        recorded, see `_legacy_position`). Creates the group where missing; returns the positions."""
        import redis as redis_lib

        for stream in self.streams:
            try:
                self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis_lib.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            position = (covered or {}).get(stream) if covered is not None else self._legacy_position(stream)
            position = position or Position()
            self.redis.xgroup_setid(stream, self.group, position.last_id, entries_read=position.entries_read)
            self.positions[stream] = position
        return dict(self.positions)

    def _legacy_position(self, stream: str) -> Position:
        """For a checkpoint without positions: where the group stood when that checkpoint acked
        (just before its first pending entry; acks happen at checkpoints only). Right when that
        checkpoint is the newest; a fallback past a newer one cannot be told from Redis."""
        info: dict = next((g for g in self.redis.xinfo_groups(stream) if g.get("name") == self.group), {})
        read, delivered = info.get("entries-read"), info.get("last-delivered-id", START)
        summary = self.redis.xpending(stream, self.group)
        pending = int(summary.get("pending") or 0)
        last_id = before(summary["min"]) if pending else str(delivered)
        entries = max(0, int(read) - pending) if read is not None else int(self.redis.xlen(stream))
        log.warning(
            "%s: the checkpoint records no stream position; continuing after %s (%d entries)", stream, last_id, entries
        )
        return Position(last_id, entries)

    def read(self, wanted: int, keep_waiting: Callable[[], bool], block_ms: int = 1000) -> list[tuple[str, str, dict]]:
        """Up to `wanted` messages `(stream, id, fields)`, at least one, from the streams in turn
        (blocks, calling `keep_waiting()` about every `block_ms`; [] as soon as it says False).
        Every message read is covered by `positions` from now on: the caller trains it, or rejects
        it, in the step it is for (or puts `positions` back)."""
        per_stream_ms = max(1, block_ms // len(self.streams))
        while True:
            if not keep_waiting():
                return []
            stream = self.streams[self._turn % len(self.streams)]
            self._turn += 1
            reply = self.redis.xreadgroup(self.group, self.consumer, {stream: ">"}, count=wanted, block=per_stream_ms)
            out = []
            for _stream, messages in reply or []:
                for message_id, fields in messages:
                    out.append((stream, message_id, fields))
            if out:
                p = self.positions[stream]
                self.positions[stream] = Position(out[-1][1], p.entries_read + len(out))
                return out

    def ack(self, ids: list[tuple[str, str]]) -> None:
        """Acknowledge messages a checkpoint now covers (keeps the pending list short; a restart
        finds its place from the checkpoint's positions, not from acks)."""
        for stream in self.streams:
            acked = [message_id for s, message_id in ids if s == stream]
            if acked:
                self.redis.xack(stream, self.group, *acked)
