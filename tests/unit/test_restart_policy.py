"""Exit classification and restart decisions, over plain floats as the clock (no processes)."""

from __future__ import annotations

import pytest

from rlrun.supervisor.policy import (
    CONFIG_ERROR_CODE,
    ExitKind,
    RestartPolicy,
    RestartTracker,
    classify_exit,
)

CRASH = classify_exit(1, finishes=False)

# Backoff 1, 2, 4, 8, 10 (capped), ...; healthy after 60 s; 3 restarts per 100 s.
POLICY = RestartPolicy(
    restart=True,
    max_restarts=3,
    window_s=100.0,
    backoff_initial_s=1.0,
    backoff_factor=2.0,
    backoff_max_s=10.0,
    healthy_after_s=60.0,
)


def fail_quickly(tracker: RestartTracker, now: float, uptime: float = 1.0):
    """Start at `now`, fail `uptime` seconds later; return (failure time, decision)."""
    tracker.on_started(now)
    return now + uptime, tracker.on_failure(now + uptime, CRASH)


# --- classification ------------------------------------------------------------------------------


def test_zero_is_done_for_a_role_that_finishes():
    info = classify_exit(0, finishes=True)
    assert info.kind is ExitKind.DONE
    assert not info.is_failure


def test_zero_is_a_crash_for_a_service():
    info = classify_exit(0, finishes=False)
    assert info.kind is ExitKind.CRASH
    assert info.is_failure
    assert info.description == "exited with code 0 although it is a service"


@pytest.mark.parametrize("finishes", [True, False])
def test_two_is_a_config_error(finishes):
    info = classify_exit(2, finishes=finishes)  # the code a role exits with on a usage/config error (the CLI's too)
    assert info.kind is ExitKind.CONFIG_ERROR and info.is_failure
    assert info.description == "exited with code 2 (usage or configuration error)"
    assert classify_exit(CONFIG_ERROR_CODE, finishes=finishes) == info


@pytest.mark.parametrize("code", [1, 3, 137])
def test_other_codes_are_crashes(code):
    info = classify_exit(code, finishes=True)
    assert info.kind is ExitKind.CRASH
    assert info.description == f"exited with code {code}"
    assert info.signal is None


def test_sigkill_is_named_and_mentions_the_oom_killer():
    info = classify_exit(-9, finishes=True)
    assert info.kind is ExitKind.KILLED
    assert info.signal == "SIGKILL"
    assert info.description == "killed by SIGKILL (possibly the OOM killer)"


def test_sigterm_is_named_without_the_oom_hint():
    info = classify_exit(-15, finishes=False)
    assert info.kind is ExitKind.KILLED
    assert info.signal == "SIGTERM"
    assert info.description == "killed by SIGTERM"
    assert "OOM" not in info.description


def test_unknown_status_is_a_crash():
    info = classify_exit(None, finishes=True)
    assert info.kind is ExitKind.CRASH
    assert info.code is None
    assert "unknown" in info.description


def test_stalled_wins_over_the_watchdogs_own_signal():
    info = classify_exit(-9, finishes=False, stalled=True, stalled_for_s=45)
    assert info.kind is ExitKind.STALLED
    assert info.code == -9
    assert info.description.startswith("stalled: no progress for 45 s")
    assert "OOM" not in info.description


def test_stalled_without_duration_or_status():
    info = classify_exit(None, finishes=True, stalled=True)
    assert info.kind is ExitKind.STALLED
    assert info.description.startswith("stalled: no progress")


# --- backoff -------------------------------------------------------------------------------------


def test_backoff_doubles_then_is_capped():
    tracker = RestartTracker(RestartPolicy(max_restarts=100, window_s=1000.0, backoff_max_s=10.0))
    delays, now = [], 0.0
    for _ in range(6):
        now, decision = fail_quickly(tracker, now)
        assert decision.action == "restart"
        delays.append(decision.delay_s)
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert tracker.consecutive_failures == 6


def test_backoff_with_factor_three_and_initial_half_second():
    policy = RestartPolicy(max_restarts=10, backoff_initial_s=0.5, backoff_factor=3.0, backoff_max_s=100.0)
    assert [policy.backoff_s(n) for n in (1, 2, 3, 4, 5, 6)] == [0.5, 1.5, 4.5, 13.5, 40.5, 100.0]


def test_backoff_never_overflows():
    assert POLICY.backoff_s(100_000) == 10.0


def test_backoff_resets_after_a_healthy_period():
    tracker = RestartTracker(POLICY)
    now, first = fail_quickly(tracker, 0.0)
    now, second = fail_quickly(tracker, now)
    assert (first.delay_s, second.delay_s) == (1.0, 2.0)
    # Up for exactly healthy_after_s before failing: the backoff starts again.
    now, third = fail_quickly(tracker, now, uptime=60.0)
    assert third.delay_s == 1.0
    assert tracker.consecutive_failures == 1
    # And grows again from there.
    now, fourth = fail_quickly(tracker, now + 50.0)  # after the window: the budget is free again
    assert fourth.delay_s == 2.0


def test_just_under_the_healthy_period_keeps_growing():
    tracker = RestartTracker(POLICY)
    now, _ = fail_quickly(tracker, 0.0)
    now, _ = fail_quickly(tracker, now, uptime=59.9)
    assert tracker.consecutive_failures == 2


def test_failure_without_a_start_is_not_healthy():
    tracker = RestartTracker(POLICY)
    tracker.on_started(0.0)
    assert tracker.on_failure(1.0, CRASH).delay_s == 1.0
    # Never reported started again (e.g. its spawn failed): its uptime is unknown, not healthy.
    assert tracker.on_failure(80.0, CRASH).delay_s == 2.0


# --- budget --------------------------------------------------------------------------------------


def test_budget_is_spent_by_the_fourth_failure_within_the_window():
    tracker = RestartTracker(POLICY)
    decisions = []
    now = 0.0
    for _ in range(4):
        now, decision = fail_quickly(tracker, now)  # failures at 1, 2, 3, 4
        decisions.append(decision)
    assert [d.action for d in decisions] == ["restart", "restart", "restart", "give_up"]
    assert [d.restarts_used for d in decisions] == [1, 2, 3, 3]
    assert all(d.budget == 3 for d in decisions)
    last = decisions[-1]
    assert last.delay_s == 0.0
    assert "3 restarts within 100 s used up" in last.reason
    assert "exited with code 1" in last.reason


def test_budget_recovers_as_the_window_slides():
    tracker = RestartTracker(POLICY)
    for t in (1.0, 2.0, 3.0):
        tracker.on_started(t - 1.0)
        assert tracker.on_failure(t, CRASH).action == "restart"
    assert tracker.restarts_used(3.0) == 3
    # At 100.5 the restart of t=1 is 99.5 s old: still inside, the budget is still spent.
    assert tracker.restarts_used(100.5) == 3
    tracker.on_started(100.0)
    assert tracker.on_failure(100.5, CRASH).action == "give_up"
    # At 101 the restart of t=1 is exactly window_s old and has left the window: one is free.
    assert tracker.restarts_used(101.0) == 2
    tracker.on_started(100.6)
    decision = tracker.on_failure(101.0, CRASH)
    assert decision.action == "restart"
    assert decision.restarts_used == 3
    # Long after, the whole window is empty again.
    assert tracker.restarts_used(1000.0) == 0


def test_give_up_does_not_consume_the_budget():
    tracker = RestartTracker(POLICY)
    for t in (1.0, 2.0, 3.0):
        tracker.on_failure(t, CRASH)
    assert tracker.on_failure(4.0, CRASH).action == "give_up"
    assert tracker.restarts_used(4.0) == 3
    # The restarts of 1, 2, 3 leave the window at 101, 102, 103; the give-up at 4 left nothing.
    assert tracker.restarts_used(101.0) == 2


def test_zero_budget_gives_up_at_once():
    tracker = RestartTracker(RestartPolicy(max_restarts=0))
    decision = tracker.on_failure(1.0, CRASH)
    assert decision.action == "give_up"
    assert decision.budget == 0
    assert "max_restarts is 0" in decision.reason


# --- never retried -------------------------------------------------------------------------------


def test_config_error_is_never_retried_even_with_budget_left():
    tracker = RestartTracker(POLICY)
    tracker.on_started(0.0)
    decision = tracker.on_failure(500.0, classify_exit(2, finishes=True))
    assert decision.action == "give_up"
    assert decision.restarts_used == 0
    assert "code 2" in decision.reason
    assert tracker.restarts_used(500.0) == 0


def test_restart_disabled_gives_up_on_the_first_failure():
    tracker = RestartTracker(RestartPolicy(restart=False, max_restarts=5))
    decision = tracker.on_failure(1.0, classify_exit(-9, finishes=False))
    assert decision.action == "give_up"
    assert "disabled" in decision.reason
    assert "SIGKILL" in decision.reason


@pytest.mark.parametrize(
    "info",
    [
        classify_exit(-9, finishes=False),
        classify_exit(0, finishes=False),
        classify_exit(None, finishes=True, stalled=True),
    ],
)
def test_signals_stalls_and_service_exits_are_retried(info):
    decision = RestartTracker(POLICY).on_failure(1.0, info)
    assert decision.action == "restart"
    assert decision.delay_s == 1.0
    assert info.description in decision.reason


def test_done_is_not_a_failure():
    with pytest.raises(ValueError, match="not a failure"):
        RestartTracker(POLICY).on_failure(1.0, classify_exit(0, finishes=True))


def test_same_history_same_decisions():
    def replay():
        tracker = RestartTracker(POLICY)
        out = []
        for start, end in [(0, 1), (2, 3), (4, 70), (71, 72), (73, 76), (100, 102)]:
            tracker.on_started(start)
            out.append(tracker.on_failure(end, CRASH))
        return out

    first = replay()
    assert first == replay()
    assert [(d.action, d.delay_s, d.restarts_used) for d in first] == [
        ("restart", 1.0, 1),
        ("restart", 2.0, 2),
        ("restart", 1.0, 3),  # up 66 s: healthy, backoff reset
        ("give_up", 0.0, 3),  # restarts at 1, 3, 70 all within 100 s
        ("give_up", 0.0, 3),
        ("restart", 2.0, 3),  # at 102 the restart of 1 has left the window; second quick failure
    ]


# --- policy validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_restarts": -1}, "max_restarts"),
        ({"window_s": 0}, "window_s"),
        ({"backoff_initial_s": -1}, "backoff_initial_s"),
        ({"backoff_factor": 0.5}, "backoff_factor"),
        ({"backoff_initial_s": 5, "backoff_max_s": 2}, "backoff_max_s"),
        ({"healthy_after_s": -1}, "healthy_after_s"),
    ],
)
def test_invalid_policy_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RestartPolicy(**kwargs)
