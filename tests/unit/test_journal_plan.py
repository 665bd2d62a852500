"""The replay plan: every sample state, budget arithmetic, staleness, counters. Pure, no Redis."""

from __future__ import annotations

import pytest

from rlrun.actor.sampling import SampleState, remaining_budget
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
    assert counters.prefixes_dropped_stale == counters.tokens_dropped_stale == counters.tokens_reused == 0


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
    assert plan.counters.tokens_reused == 3


def test_the_plan_does_not_share_lists_with_the_records():
    record = group([{"state": "generating", "n": 2}])
    s = plan_replay([record], current_version=5, max_prefix_staleness=0).groups[0].samples[0]
    s.prefix_token_ids.append(99)
    assert record.samples[0].token_ids == [0, 1]


def test_finished_sample_is_kept_with_its_reason():
    (stop, length), counters = plan_one(
        [{"state": "finished", "n": 3, "finish": "stop"}, {"state": "finished", "n": BUDGET, "finish": "length"}]
    )
    assert stop.action == length.action == Action.KEEP
    assert (stop.finish_reason, length.finish_reason) == ("stop", "length")
    assert stop.prefix_token_ids == [0, 1, 2]
    assert counters.tokens_reused == 3 + BUDGET


def test_finished_sample_is_kept_even_when_its_tokens_are_old():
    (s,), counters = plan_one([{"state": "finished", "versions": [0, 0], "finish": "stop"}], current_version=10)
    assert s.action == Action.KEEP and counters.prefixes_dropped_stale == 0


@pytest.mark.parametrize("held", [BUDGET, BUDGET + 3])
def test_unfinished_sample_with_its_budget_spent_is_finished_locally_as_length(held):
    (s,), counters = plan_one([{"state": "generating", "n": held}])
    assert s.action == Action.FINISH_LENGTH
    assert s.finish_reason == "length"
    assert len(s.prefix_token_ids) == held  # kept exactly, never truncated
    assert counters.tokens_reused == held


@pytest.mark.parametrize("held, left", [(1, BUDGET - 1), (BUDGET - 1, 1), (BUDGET, 0)])
def test_budget_arithmetic(held, left):
    (s,), _ = plan_one([{"state": "generating", "n": held}])
    assert s.action == (Action.CONTINUE if left else Action.FINISH_LENGTH)
    continued = SampleState(s.index, list(s.prefix_token_ids))  # what the actor rebuilds from the plan
    assert remaining_budget(continued, BUDGET) == left


def test_budget_of_one_token():
    (fresh, spent), _ = plan_one([{}, {"state": "generating", "n": 1}], budget=1)
    assert (fresh.action, fresh.prefix_token_ids) == (Action.RESTART, [])
    assert (spent.action, len(spent.prefix_token_ids)) == (Action.FINISH_LENGTH, 1)


def test_stale_prefix_is_dropped_counted_and_restarted():
    (s,), counters = plan_one([{"state": "generating", "versions": [2, 2, 3]}], current_version=5, staleness=2)
    assert s.action == Action.RESTART
    assert s.prefix_token_ids == [] and s.dropped_tokens == 3
    assert counters.prefixes_dropped_stale == 1 and counters.tokens_dropped_stale == 3
    assert counters.tokens_reused == 0


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
        {"state": "generating", "n": BUDGET},  # finish_length
        {"state": "generating", "versions": [1, 5]},  # stale: restart
    ]
    samples, counters = plan_one(spec, current_version=5, staleness=1)
    assert [s.action for s in samples] == [
        Action.RESTART, Action.CONTINUE, Action.KEEP, Action.FINISH_LENGTH, Action.RESTART,
    ]
    assert [s.index for s in samples] == [0, 1, 2, 3, 4]
    assert [len(s.prefix_token_ids) for s in samples] == [0, 3, 4, BUDGET, 0]
    assert (counters.prefixes_dropped_stale, counters.tokens_reused, counters.tokens_dropped_stale) == (1, 3 + 4 + BUDGET, 2)


def test_groups_come_back_in_cursor_order_with_their_prompt():
    groups = [group([{}], cursor=c) for c in (7, 2, 5)]
    plan = plan_replay(groups, current_version=0, max_prefix_staleness=0)
    assert [g.header.cursor for g in plan.groups] == [2, 5, 7]
    g = plan.groups[0].header
    assert (g.group_id, g.prompt_index, g.prompt_ids, g.group_size, g.max_new_tokens) == ("run/2", 42, [1, 2, 3], 1, BUDGET)


def test_an_empty_journal_plans_nothing():
    plan = plan_replay([], current_version=3, max_prefix_staleness=1)
    assert plan.groups == [] and plan.counters == ReplayCounters()
