"""Effective training time from recorded histories: the wall time split, ETTR, and the cost of
each failure, computed by hand for small event/metrics histories."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlrun.telemetry.ettr import BUCKETS, split_wall_time


def ev(t, kind, **fields):
    return {"time": t, "event": kind, **fields}


def rec(t, step, step_time, wait=0.0, weights=0.0, **counters):
    return {"time": t, "step": step, "step_time_s": step_time, "wait_s": wait, "weights_s": weights, **counters}


def test_a_trainer_failure_costs_its_recovery_and_the_step_taken_again():
    events = [
        ev(0, "run_started"),
        ev(27, "process_failed", process="trainer", reason="killed by SIGKILL", action="restart"),
        ev(50, "run_stopped", status="finished"),
    ]
    records = [
        rec(20, 1, 10, wait=6, weights=1, tokens_regenerated=0, tokens_reused=0),  # begins at 10
        rec(25, 2, 5, wait=1, weights=1, tokens_regenerated=100, tokens_reused=7, tokens_kept_on_retry=3),  # lost: taken again
        rec(40, 2, 4, wait=2, weights=0.5, tokens_regenerated=130, tokens_reused=9, tokens_kept_on_retry=8),
        rec(45, 3, 5, tokens_regenerated=130, tokens_reused=9),
    ]
    split = split_wall_time(events, records)
    assert split.wall_s == 50
    assert split.seconds == {
        "training": 3 + 5,  # step 1 [16, 19], step 3 [40, 45]
        "waiting": 6,  # step 1 [10, 16]
        "weights": 1,  # step 1 [19, 20]
        "recovery": 5 + 13,  # the lost step 2 [20, 25], the failure to the next step [27, 40]
        "start_stop": 10 + 5,  # [0, 10], [45, 50]
        "other": 2,  # [25, 27]
    }
    assert split.ettr == pytest.approx(8 / 50)
    (failure,) = split.failures
    assert (failure.process, failure.recovery_s, failure.steps_retaken) == ("trainer", 13, 1)
    assert (failure.tokens_regenerated, failure.tokens_reused) == (30, 2 + 5)  # kept from the journal, and on retries
    assert split.to_dict()["steps_retaken"] == 1 and split.to_dict()["ettr"] == 0.16


def test_a_resumed_launch_counts_its_start_as_recovery_and_the_time_between_launches_not_at_all():
    events = [
        ev(0, "run_started"),
        ev(3, "process_ready", process="trainer"),  # then rlrun is killed: no run_stopped
        ev(100, "run_resumed"),
        ev(140, "run_stopped", status="finished"),
    ]
    records = [rec(10, 1, 5), rec(130, 2, 10)]
    split = split_wall_time(events, records)
    assert split.wall_s == 10 + 40  # [0, 10] (up to its last record), [100, 140]
    assert split.seconds["training"] == 5 + 10
    assert split.seconds["recovery"] == 20  # [100, 120]
    assert split.seconds["start_stop"] == 5 + 10  # [0, 5], [130, 140]
    assert split.failures == []


def test_a_live_run_is_split_up_to_now_and_its_last_stretch_is_not_a_stop():
    split = split_wall_time([ev(0, "run_started")], [rec(10, 1, 5)], now=30)
    assert split.wall_s == 30
    assert split.seconds["start_stop"] == 5 and split.seconds["training"] == 5 and split.seconds["other"] == 20


def test_a_failure_with_no_step_since_is_recovery_up_to_the_end_and_has_no_recovery_time():
    events = [ev(0, "run_started"), ev(12, "process_failed", process="vllm-0", reason="x"), ev(20, "run_stopped")]
    split = split_wall_time(events, [rec(10, 1, 5)])
    assert split.seconds["recovery"] == 8 and split.failures[0].recovery_s is None


def test_no_events_no_time():
    split = split_wall_time([], [])
    assert split.wall_s == 0 and split.ettr is None and set(split.seconds) == set(BUCKETS)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 20), st.floats(0, 1), st.floats(0, 1), st.integers(1, 6)), max_size=30),
    st.lists(st.floats(0, 300), max_size=5),
)
def test_the_parts_always_add_up_to_the_wall_time(steps, failure_times):
    t, records = 5.0, []
    for duration, wait_share, weights_share, step in steps:
        t += duration + 0.5
        records.append(rec(t, step, duration, wait=duration * wait_share, weights=duration * weights_share * (1 - wait_share)))
    events = [ev(0, "run_started"), *[ev(f, "process_failed", process="actor") for f in failure_times], ev(t + 3, "run_stopped")]
    split = split_wall_time(events, records)
    assert sum(split.seconds.values()) == pytest.approx(split.wall_s, abs=1e-6)
    assert all(value >= -1e-9 for value in split.seconds.values())
    if records:
        assert 0 <= split.ettr <= 1
    else:  # no step records (trainer=fast_llm writes none): not measured, not 0 %
        assert split.ettr is None


def test_a_stall_costs_from_when_the_process_went_quiet_not_from_when_it_was_declared():
    events = [
        ev(0, "run_started"),
        ev(30, "process_stalled", process="actor", quiet_s=12),
        ev(31, "process_failed", process="actor", reason="stalled: no progress for 12 s"),
        ev(60, "run_stopped"),
    ]
    split = split_wall_time(events, [rec(10, 1, 5), rec(40, 2, 5)])
    (failure,) = split.failures
    assert failure.time == 18 and failure.recovery_s == 22  # quiet from 18, the next step ends at 40
    assert split.seconds["recovery"] == 22
