"""The replay plan: what to do with every sample of the journal's open groups after a restart.

A pure function over records (no Redis, no clock). For each open group's samples:

- `keep`: finished; its tokens are used as they are.
- `continue`: unfinished, it holds a prefix that is not stale, kept exactly. What becomes of it
  (generated on from `prompt + prefix`, or closed as "length" when it spent its budget) is the
  actor's budget rule: `rlrun.actor.replay.resume` turns a plan into the actor's groups.
- `restart`: no tokens, or a stale prefix (its OLDEST token from a policy older than
  `current_version - max_prefix_staleness`), dropped and counted: generated from the prompt alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Optional

from rlrun.journal.records import GroupHeader, GroupRecord, SampleRecord


class Action(StrEnum):
    KEEP = "keep"
    CONTINUE = "continue"
    RESTART = "restart"


@dataclass(frozen=True)
class SamplePlan:
    index: int
    action: Action
    prefix_token_ids: list[int] = field(default_factory=list)  # tokens kept (all but for restart: none)
    prefix_logprobs: list[float] = field(default_factory=list)
    prefix_versions: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None  # keep: the recorded reason
    dropped_tokens: int = 0  # restart: tokens of a stale prefix that were dropped
    turn_ends: list[list] = field(default_factory=list)  # a conversation's, as recorded (SampleRecord)
    observations: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class GroupPlan:
    header: GroupHeader
    samples: list[SamplePlan]


@dataclass
class ReplayCounters:
    """What the plan drops (what it keeps the actor counts, once it knows what it continues)."""

    prefixes_dropped_stale: int = 0
    tokens_dropped_stale: int = 0


@dataclass(frozen=True)
class ReplayPlan:
    groups: list[GroupPlan]  # open groups, in cursor order
    counters: ReplayCounters = field(default_factory=ReplayCounters)


def is_stale(sample, current_version: int, max_staleness: int) -> bool:
    """An unfinished prefix whose oldest token is more than `max_staleness` versions old: of a
    sample read back from the journal (`SampleRecord`) or being generated (the actor's `SampleState`)."""
    return bool(sample.versions) and not sample.finished and min(sample.versions) < current_version - max_staleness


def plan_replay(
    groups: list[GroupRecord], *, current_version: int, max_prefix_staleness: int, conversations: bool = False
) -> ReplayPlan:
    """The replay plan for `groups` when vLLM serves policy `current_version`. `conversations`:
    no prefix is stale, whatever its age: dropping one would run its finished steps (tools) again;
    the behaviour log-probs the journal keeps make its old tokens correct to train on."""
    if max_prefix_staleness < 0:
        raise ValueError(f"max_prefix_staleness must be >= 0, got {max_prefix_staleness}")
    counters = ReplayCounters()
    planned = []
    for group in sorted(groups, key=lambda g: g.cursor):
        staleness = max(current_version, max_prefix_staleness) if conversations else max_prefix_staleness
        samples = [_plan_sample(s, current_version, staleness, counters) for s in group.samples]
        planned.append(GroupPlan(group.header, samples))
    return ReplayPlan(groups=planned, counters=counters)


def _plan_sample(sample: SampleRecord, version: int, staleness: int, counters: ReplayCounters) -> SamplePlan:
    held = len(sample.token_ids)
    if is_stale(sample, version, staleness):
        counters.prefixes_dropped_stale += 1
        counters.tokens_dropped_stale += held
        return SamplePlan(sample.index, Action.RESTART, dropped_tokens=held)
    if not sample.finished and not held:
        return SamplePlan(sample.index, Action.RESTART)
    return SamplePlan(
        index=sample.index,
        action=Action.KEEP if sample.finished else Action.CONTINUE,
        prefix_token_ids=list(sample.token_ids),
        prefix_logprobs=list(sample.logprobs),
        prefix_versions=list(sample.versions),
        finish_reason=sample.finish_reason if sample.finished else None,
        turn_ends=[list(t) for t in sample.turn_ends],
        observations=[dict(o) for o in sample.observations],
    )
