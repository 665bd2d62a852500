"""One replay rule: a replay plan of the journal (`rlrun.journal.plan`) turned into the groups the
actor works on after a (re)start. Pure: no Redis; the journal resets it asks for are the caller's.

Each planned sample becomes a `SampleState` holding its kept prefix, every token of it journaled:
`keep` finished (the journal knows it); `continue` generated on from its prefix, or closed as
"length" by the actor's budget rule (`close_if_spent`) when nothing is left (recorded by the first
flush); `restart` empty, its journal entry to be reset. What the replay kept is counted here, once:
those tokens are marked counted, so a failed request later counts only what it adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlrun.actor.sampling import LiveGroup, SampleState, close_if_spent
from rlrun.journal.plan import Action, ReplayPlan


@dataclass(frozen=True)
class Resumed:
    groups: list[LiveGroup]  # in the plan's (cursor) order
    resets: list[tuple[str, int]]  # (group_id, sample index) to forget in the journal: restarted samples
    tokens_reused: int  # tokens kept from the journal (keep and continue, closed or not)
    samples_continued: int  # samples generated on from a kept prefix


def resume(plan: ReplayPlan, conversations: bool = False) -> Resumed:
    """The actor's live groups for `plan`, each with the budget its group was opened with. A
    conversation's budget is the whole conversation's: one that spent it is left to the actor,
    whose environment still has to answer its last turn."""
    groups, resets, reused, continued = [], [], 0, 0
    for group in plan.groups:
        h, samples = group.header, []
        for p in group.samples:
            sample = SampleState(p.index, list(p.prefix_token_ids), list(p.prefix_logprobs), list(p.prefix_versions))
            sample.journaled = sample.kept_counted = len(sample.completion_ids)
            if p.action is Action.RESTART:
                resets.append((h.group_id, p.index))
            elif p.action is Action.KEEP:
                sample.finish_reason, sample.finish_recorded = p.finish_reason, True
            elif conversations or not close_if_spent(sample, h.max_new_tokens):
                continued += 1
            sample.take_conversation(p.turn_ends, p.observations)
            reused += len(sample.completion_ids)
            samples.append(sample)
        groups.append(LiveGroup(h.group_id, h.cursor, h.prompt_index, list(h.prompt_ids), h.max_new_tokens, samples))
    return Resumed(groups, resets, reused, continued)
