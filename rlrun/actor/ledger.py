"""Where the actor records its groups: `JournalLedger`, the token journal in Redis (every token
survives any restart, delivery is exactly-once), or `MemoryLedger`, which keeps nothing across a
restart and exists so the journal's overhead can be measured against it (`actor.journal=false`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Optional

from rlrun.actor.sampling import SampleState
from rlrun.journal.records import GroupHeader, GroupRecord, version_runs
from rlrun.journal.store import KEY_PREFIX, Append, Journal, WriteResult
from rlrun.streams import names

TRIM_EVERY = 256  # deliveries between trims of old delivered markers
KEEP_DELIVERED = 10_000  # delivered markers kept (a replay older than that cannot happen)


class JournalLedger(Journal):
    """The journal, spoken to in the actor's samples. The actor is the journal's only writer (the
    supervisor runs one), so the prompt cursor is read once and then followed locally: no round
    trip to count or open groups. Were it wrong, the compare-and-set refuses the open and the
    real cursor is taken."""

    def __init__(self, redis, prefix: str = KEY_PREFIX) -> None:
        super().__init__(redis, prefix)
        self._deliveries = 0
        self._cursor = self.cursor()

    def open_next(self, index_for, ids_for, size, budget, run) -> GroupHeader:
        r = self.open_group(
            index_for, ids_for, group_size=size, max_new_tokens=budget, run=run, cursor_hint=self._cursor
        )
        self._cursor = r.cursor + 1
        return r.header

    def append_samples(self, group_id: str, samples: list[SampleState]) -> list[WriteResult]:
        """One round trip for the samples' new tokens (split into runs of one policy version),
        for finished samples their finish, and the versions vLLM reported for tokens journaled
        before it said (both carried by their last append)."""
        appends, owners = [], []
        for sample in samples:
            offset = sample.journaled
            runs = []
            finish = sample.finish_reason if sample.finished and not sample.finish_recorded else None
            turn_end = sample.turn_end if sample.turn_end is not None and not sample.turn_end_recorded else None
            relabel = version_runs(sample.versions[: sample.journaled]) if sample.relabel_pending else []
            for version, same in groupby(sample.versions[offset:]):
                end = offset + len(list(same))
                runs.append(
                    Append(
                        group_id,
                        sample.index,
                        offset,
                        sample.completion_ids[offset:end],
                        sample.logprobs[offset:end],
                        version,
                    )
                )
                offset = end
            if (
                finish is not None or relabel or turn_end is not None
            ):  # on the last run, or alone (no tokens: no version)
                final = runs.pop() if runs else Append(group_id, sample.index, offset, [], [], 0)
                runs.append(replace(final, finish_reason=finish, relabel=relabel, turn_end=turn_end))
            appends.extend(runs)
            owners.extend([sample.index] * len(runs))
        results = self.append_many(appends)
        last: dict[int, WriteResult] = {}
        for index, result in zip(owners, results):
            if index not in last or last[index].accepted:  # keep the first refusal, else the last answer
                last[index] = result
        return [last[s.index] for s in samples if s.index in last]

    def append_observation(self, group_id: str, sample: SampleState, finish: Optional[str] = None) -> WriteResult:
        """The sample's last observation (its tokens, and the step's answer that made them), once
        its model tokens are journaled; with `finish` the conversation ends with it (the last step)."""
        observation = sample.observations[-1]
        start, end = observation["start"], observation["end"]
        payload = {k: v for k, v in observation.items() if k not in ("start", "end")}
        version = sample.versions[start] if end > start else 0
        append = Append(
            group_id,
            sample.index,
            start,
            sample.completion_ids[start:end],
            sample.logprobs[start:end],
            version,
            finish_reason=finish,
            observation=payload,
        )
        return self.append_many([append])[0]

    def deliver(self, group_id: str, stream: str, messages: Sequence[str]) -> Optional[str]:
        stream_id = super().deliver(group_id, stream, messages)
        self._deliveries += 1
        if self._deliveries % TRIM_EVERY == 0:
            self.trim_delivered(keep_last=KEEP_DELIVERED)
        return stream_id


@dataclass(frozen=True)
class Flushed:
    sample: SampleState
    offset: int  # where its append started: the tokens the actor believed journaled
    result: WriteResult


def flush(ledger: "JournalLedger | MemoryLedger", group_id: str, samples: list[SampleState]) -> list[Flushed]:
    """Append the samples' unjournaled tokens, record their finishes and relabels, in one round
    trip. An accepted append moves the sample's marks; a refused one is left as it was: the actor's
    view and the journal's disagree, and the caller takes the journal's (`SampleState.take_journal`)."""
    batch = [
        s
        for s in samples
        if len(s.completion_ids) > s.journaled
        or (s.finished and not s.finish_recorded)
        or s.relabel_pending
        or (s.turn_end is not None and not s.turn_end_recorded)
    ]
    flushed = [Flushed(s, s.journaled, r) for s, r in zip(batch, ledger.append_samples(group_id, batch))]
    for f in flushed:
        if f.result.accepted:
            f.sample.journaled, f.sample.finish_recorded, f.sample.relabel_pending = (
                f.result.length,
                f.sample.finished,
                False,
            )
            f.sample.turn_end_recorded = f.sample.turn_end is not None
    return flushed


class MemoryLedger:
    """No journal: groups in flight are lost with the actor. For measuring overhead only. Nothing
    is replayed from it, so nothing of a replay (quarantine) is ever asked of it."""

    def __init__(self, redis) -> None:
        self.redis = redis
        self._cursor = int((redis.hget(names.ACTOR_STATE, "cursor") or 0))

    def open_next(self, index_for, ids_for, size, budget, run) -> GroupHeader:
        cursor = self._cursor
        self._cursor += 1
        self.redis.hset(names.ACTOR_STATE, "cursor", self._cursor)
        index = index_for(cursor)
        return GroupHeader(f"{run}/{cursor}", cursor, index, list(ids_for(index)), size, budget)

    def load_open_groups(self):
        return [], []

    def append_samples(self, group_id: str, samples: list[SampleState]) -> list[WriteResult]:
        return [WriteResult(True, len(s.completion_ids), "ok") for s in samples]

    def append_observation(self, group_id: str, sample: SampleState, finish: Optional[str] = None) -> WriteResult:
        return WriteResult(True, len(sample.completion_ids), "ok")

    def reset(self, group_id: str, index: int) -> None:
        pass

    def read_group(self, group_id: str) -> tuple[Optional[GroupRecord], list[str]]:
        return None, []

    def deliver(self, group_id: str, stream: str, messages: Sequence[str]) -> Optional[str]:
        if not messages:  # a dropped group: nothing to publish, nothing kept to mark
            return ""
        with self.redis.pipeline(transaction=True) as tx:
            for message in messages:
                tx.xadd(stream, {"data": message})
            tx.hincrby(names.ACTOR_STATE, "groups_published", 1)
            stream_id = tx.execute()[-2]
        return stream_id
