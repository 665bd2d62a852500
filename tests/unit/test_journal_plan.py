"""The replay plan: every sample state, staleness, counters; and `resume`, the one rule that turns
a plan into the actor's groups (its budget rule, what it counts as kept). Pure, no Redis."""

from __future__ import annotations

import pytest

from rlrun.actor.replay import resume
from rlrun.actor.sampling import remaining_budget
from rlrun.journal.plan import Action, ReplayCounters, plan_replay
from rlrun.journal.records import GroupRecord, SampleRecord

BUDGET = 8


def sample(index: int, state: str = "pending", n: int = 0, versions=None, finish=None, gid="run/0"):
    versions = list(versions) if versions is not None else [5] * n
    n = len(versions)
    return SampleRecord(
        gid, index, state,
        token_ids=[100 * index + k for k in range(n)],
        logprobs=[-0.125 * (k + 1) - index for k in range(n)],
        versions=versions,
        finish_reason=finish,
    )


def group(samples_spec, cursor=0, budget=BUDGET) -> GroupRecord:
    gid = f"run/{cursor}"
    samples = [sample(i, gid=gid, **spec) for i, spec in enumerate(samples_spec)]
    return GroupRecord(gid, cursor, 40 + cursor, [1, 2, 3], len(samples), budget, samples)


def plan_one(spec, current_version=5, staleness=2, budget=BUDGET):
    plan = plan_replay([group(spec, budget=budget)], current_version=current_version, max_prefix_staleness=staleness)
    assert len(plan.groups) == 1
    return plan.groups[0].samples, plan.counters


def test_pending_sample_without_tokens_restarts_with_the_whole_budget():
    (s,), counters = plan_one([{}])
    assert s.action == Action.RESTART
    assert (s.prefix_token_ids, s.prefix_logprobs, s.prefix_versions) == ([], [], [])
    assert s.dropped_tokens == 0
    assert counters.prefixes_dropped_stale == counters.tokens_dropped_stale == 0


def test_generating_sample_continues_from_its_exact_prefix_with_what_is_left_of_the_budget():
    record = group([{"state": "generating", "versions": [4, 5, 5]}])
    plan = plan_replay([record], current_version=5, max_prefix_staleness=2)
    (s,) = plan.groups[0].samples
    source = record.samples[0]
    assert s.action == Action.CONTINUE
    assert s.prefix_token_ids == source.token_ids == [0, 1, 2]
    assert s.prefix_logprobs == source.logprobs == [-0.125, -0.25, -0.375]
    assert s.prefix_versions == [4, 5, 5]
    assert s.finish_reason is None
    assert resume(plan).tokens_reused == 3


def test_the_plan_does_not_share_lists_with_the_records():
    record = group([{"state": "generating", "n": 2}])
    s = plan_replay([record], current_version=5, max_prefix_staleness=0).groups[0].samples[0]
    s.prefix_token_ids.append(99)
    assert record.samples[0].token_ids == [0, 1]


def test_finished_sample_is_kept_with_its_reason():
    plan = plan_replay([group([{"state": "finished", "n": 3, "finish": "stop"}, {"state": "finished", "n": BUDGET, "finish": "length"}])],
                       current_version=5, max_prefix_staleness=2)  # fmt: skip
    stop, length = plan.groups[0].samples
    assert stop.action == length.action == Action.KEEP
    assert (stop.finish_reason, length.finish_reason) == ("stop", "length")
    assert stop.prefix_token_ids == [0, 1, 2]
    resumed = resume(plan)
    assert [(s.finish_reason, s.finish_recorded) for s in resumed.groups[0].samples] == [("stop", True), ("length", True)]
    assert (resumed.tokens_reused, resumed.samples_continued) == (3 + BUDGET, 0)


def test_finished_sample_is_kept_even_when_its_tokens_are_old():
    (s,), counters = plan_one([{"state": "finished", "versions": [0, 0], "finish": "stop"}], current_version=10)
    assert s.action == Action.KEEP and counters.prefixes_dropped_stale == 0


@pytest.mark.parametrize("held", [BUDGET, BUDGET + 3])
def test_unfinished_sample_with_its_budget_spent_is_finished_locally_as_length(held):
    plan = plan_replay([group([{"state": "generating", "n": held}])], current_version=5, max_prefix_staleness=2)
    assert plan.groups[0].samples[0].action == Action.CONTINUE  # the plan has no budget rule: the actor's closes it
    resumed = resume(plan)
    (s,) = resumed.groups[0].samples
    assert (s.finish_reason, s.finish_recorded) == ("length", False)  # recorded by the actor's first flush
    assert len(s.completion_ids) == s.journaled == held  # kept exactly, never truncated
    assert (resumed.tokens_reused, resumed.samples_continued) == (held, 0)


@pytest.mark.parametrize("held, left", [(1, BUDGET - 1), (BUDGET - 1, 1), (BUDGET, 0)])
def test_budget_arithmetic(held, left):
    resumed = resume(plan_replay([group([{"state": "generating", "n": held}])], current_version=5, max_prefix_staleness=2))
    (s,) = resumed.groups[0].samples
    assert remaining_budget(s, resumed.groups[0].max_new_tokens) == left
    assert s.finished == (left == 0) and resumed.samples_continued == (1 if left else 0)


def test_budget_of_one_token():
    plan = plan_replay([group([{}, {"state": "generating", "n": 1}], budget=1)], current_version=5, max_prefix_staleness=2)
    fresh, spent = plan.groups[0].samples
    assert (fresh.action, fresh.prefix_token_ids) == (Action.RESTART, [])
    assert (spent.action, len(spent.prefix_token_ids)) == (Action.CONTINUE, 1)
    live = resume(plan).groups[0].samples
    assert [(s.completion_ids, s.finish_reason) for s in live] == [([], None), ([100], "length")]


def test_stale_prefix_is_dropped_counted_and_restarted():
    (s,), counters = plan_one([{"state": "generating", "versions": [2, 2, 3]}], current_version=5, staleness=2)
    assert s.action == Action.RESTART
    assert s.prefix_token_ids == [] and s.dropped_tokens == 3
    assert counters.prefixes_dropped_stale == 1 and counters.tokens_dropped_stale == 3


def test_prefix_at_the_staleness_bound_is_kept():
    (s,), counters = plan_one([{"state": "generating", "versions": [3, 4]}], current_version=5, staleness=2)
    assert s.action == Action.CONTINUE and counters.tokens_dropped_stale == 0


def test_mixed_version_prefix_is_judged_by_its_oldest_token():
    # the newest tokens are fresh, but the prefix starts with a token from version 1
    (s,), counters = plan_one([{"state": "generating", "versions": [1, 5, 5, 5]}], current_version=5, staleness=2)
    assert s.action == Action.RESTART and counters.tokens_dropped_stale == 4
    (s,), _ = plan_one([{"state": "generating", "versions": [5, 5, 3]}], current_version=5, staleness=2)
    assert s.action == Action.CONTINUE  # oldest is 3 = 5 - 2


def test_stale_prefix_with_its_budget_spent_is_restarted_not_finished():
    (s,), counters = plan_one([{"state": "generating", "versions": [0] * BUDGET}], current_version=5, staleness=1)
    assert s.action == Action.RESTART and counters.tokens_dropped_stale == BUDGET


def test_zero_staleness_keeps_only_prefixes_of_the_current_version():
    (old, cur), _ = plan_one(
        [{"state": "generating", "versions": [4]}, {"state": "generating", "versions": [5]}], current_version=5, staleness=0
    )
    assert (old.action, cur.action) == (Action.RESTART, Action.CONTINUE)


def test_negative_staleness_is_refused():
    with pytest.raises(ValueError, match="max_prefix_staleness"):
        plan_replay([], current_version=0, max_prefix_staleness=-1)


def test_a_mixed_group_and_all_counters():
    spec = [
        {},  # restart
        {"state": "generating", "n": 3},  # continue
        {"state": "finished", "n": 4, "finish": "stop"},  # keep
        {"state": "generating", "n": BUDGET},  # continue: closed as length by the actor's budget rule
        {"state": "generating", "versions": [1, 5]},  # stale: restart
    ]
    plan = plan_replay([group(spec, cursor=3)], current_version=5, max_prefix_staleness=1)
    samples, counters = plan.groups[0].samples, plan.counters
    assert [s.action for s in samples] == [
        Action.RESTART, Action.CONTINUE, Action.KEEP, Action.CONTINUE, Action.RESTART,
    ]
    assert [s.index for s in samples] == [0, 1, 2, 3, 4]
    assert [len(s.prefix_token_ids) for s in samples] == [0, 3, 4, BUDGET, 0]
    assert (counters.prefixes_dropped_stale, counters.tokens_dropped_stale) == (1, 2)
    resumed = resume(plan)
    (live,) = resumed.groups
    assert (live.group_id, live.cursor, live.prompt_index, live.prompt_ids, live.max_new_tokens) == ("run/3", 3, 43, [1, 2, 3], BUDGET)
    assert [(len(s.completion_ids), s.journaled, s.finish_reason, s.finish_recorded) for s in live.samples] == [
        (0, 0, None, False), (3, 3, None, False), (4, 4, "stop", True), (BUDGET, BUDGET, "length", False), (0, 0, None, False),
    ]  # fmt: skip
    assert resumed.resets == [("run/3", 0), ("run/3", 4)]  # the journal forgets what starts over
    assert (resumed.tokens_reused, resumed.samples_continued) == (3 + 4 + BUDGET, 1)  # each kept token once
    assert [s.kept_counted for s in live.samples] == [0, 3, 4, BUDGET, 0]  # a later failed request adds only new ones


def test_groups_come_back_in_cursor_order_with_their_prompt():
    groups = [group([{}], cursor=c) for c in (7, 2, 5)]
    plan = plan_replay(groups, current_version=0, max_prefix_staleness=0)
    assert [g.header.cursor for g in plan.groups] == [2, 5, 7]
    g = plan.groups[0].header
    assert (g.group_id, g.prompt_index, g.prompt_ids, g.group_size, g.max_new_tokens) == ("run/2", 42, [1, 2, 3], 1, BUDGET)


def test_an_empty_journal_plans_nothing():
    plan = plan_replay([], current_version=3, max_prefix_staleness=1)
    assert plan.groups == [] and plan.counters == ReplayCounters()
