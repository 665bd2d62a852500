"""Effective training time from recorded histories: the wall time split, ETTR, and the cost of
each failure, computed by hand for small event/metrics histories."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlrun.telemetry.ettr import BUCKETS, RunningEttr, split_wall_time


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


def history(seed: int, steps: int, odd: bool = False) -> list[tuple[list[dict], dict, bool]]:
    """A run step by step: (the events since the last step, the step's record, whether a new trainer
    started before it). Several launches (stopped, or killed and resumed), trainer restarts from a
    checkpoint (steps taken again), failures of other roles, stalls caught after a quiet time.
    `odd` adds what a run should not write but ETTR must still read: steps that overlap, an event
    dated before the steps already recorded, a step retaken long after, a stall quiet for minutes."""
    rng = random.Random(seed)
    t, step, checkpoint = 1000.0, 0, 0
    pending, ticks, fresh = [ev(t, "run_started")], [], True
    while len(ticks) < steps:
        draw = rng.random()
        if draw < 0.02:  # the trainer dies: restarted from its last checkpoint
            pending += [ev(t + 1, "process_failed", process="trainer", reason="SIGKILL"), ev(t + 4, "process_restarted", process="trainer")]
            t, step, fresh = t + rng.uniform(5, 30), checkpoint, True
        elif draw < 0.04:  # another role fails; the steps go on
            pending.append(ev(t + rng.uniform(0, 1), "process_failed", process=rng.choice(["actor", "vllm-0"]), reason="exit 1"))
        elif draw < 0.05:  # a stall: quiet, then declared and restarted
            quiet = rng.uniform(100, 400) if odd else rng.uniform(1, 8)
            pending += [ev(t + 0.5, "process_stalled", process="actor", quiet_s=quiet), ev(t + 0.6, "process_failed", process="actor", reason="stalled")]
        elif draw < 0.065:  # the launch ends, stopped or killed, and the run is resumed later
            if rng.random() < 0.5:
                pending.append(ev(t + 2, "run_stopped", status="stopped"))
            t += rng.uniform(3, 1000)
            pending.append(ev(t, "run_resumed"))
            t, step, fresh = t + rng.uniform(2, 90), checkpoint, True
        if odd and rng.random() < 0.02:
            pending.append(ev(t - rng.uniform(0, 200), "process_ready", process="actor"))  # dated in the past
        if odd and rng.random() < 0.01:
            step = max(0, step - rng.randint(10, 40))  # a step retaken long after
        step_time = rng.uniform(0.5, 12)
        begin = t + (rng.uniform(-3, 0.2) if odd else rng.uniform(0.01, 0.2))
        t = max(t, begin + step_time)
        step += 1
        checkpoint = step if step % 10 == 0 else checkpoint
        wait = rng.uniform(0, step_time / 2)
        ticks.append((pending, rec(round(t, 3), step, step_time, wait=wait, weights=rng.uniform(0, step_time - wait)), fresh))
        pending, fresh = [], False
    return ticks


def replay(ticks) -> tuple[list[tuple[float | None, float | None]], list[RunningEttr], list[int]]:
    """Each step's ETTR from RunningEttr (a new one at every trainer start, built from the whole
    history as the recorder builds it) and from split_wall_time over the whole history."""
    events: list[dict] = []
    records: list[dict] = []
    figures, trackers, held = [], [], []
    for new_events, record, fresh in ticks:
        if fresh:
            trackers.append(RunningEttr(list(events), list(records), reload=lambda: (list(events), list(records))))
        events += new_events
        ettr = trackers[-1].add(new_events, record, now=record["time"])
        records.append(record)
        figures.append((ettr, split_wall_time(events, records, now=record["time"]).ettr))
        held.append(trackers[-1].held)
    return figures, trackers, held


@pytest.mark.parametrize("seed", range(4))
def test_running_ettr_is_the_whole_historys_at_every_step_reading_only_whats_new(seed):
    figures, trackers, held = replay(history(seed, 400))
    assert all(running == pytest.approx(whole, abs=1e-9) for running, whole in figures), figures
    assert len(trackers) > 2 and sum(t.reloads for t in trackers) == 0  # never read the history again
    # what it holds does not grow with the run: records since the cut, events of its last minute
    assert max(held[200:]) < 60 and max(held[200:]) <= max(held[:200]) + 10


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_running_ettr_is_the_whole_historys_also_for_histories_a_run_should_not_write(seed):
    figures, trackers, _ = replay(history(seed, 150, odd=True))
    assert all(running == pytest.approx(whole, abs=1e-9) for running, whole in figures), figures


def test_running_ettr_reads_the_history_again_when_an_event_is_dated_before_its_cut():
    ticks = history(0, 60)
    events: list[dict] = []
    records: list[dict] = []
    tracker = RunningEttr([], [], reload=lambda: (list(events), list(records)))
    for new_events, record, _ in ticks:
        events += new_events
        tracker.add(new_events, record, now=record["time"])
        records.append(record)
    late = ev(records[5]["time"], "process_failed", process="vllm-0", reason="exit 1")  # a failure long past, read late
    events.append(late)
    record = rec(records[-1]["time"] + 5, records[-1]["step"] + 1, 4)
    figure = tracker.add([late], record, now=record["time"])
    assert tracker.reloads == 1
    assert figure == pytest.approx(split_wall_time(events, [*records, record], now=record["time"]).ettr, abs=1e-9)


def test_running_ettr_right_after_a_quick_resume_counts_no_launch_twice():
    ticks = [([ev(0, "run_started")] if i == 0 else [], rec(10.0 + i, i + 1, 0.9, wait=0.2), i == 0) for i in range(20)]
    ticks.append(([ev(31, "run_stopped"), ev(34, "run_resumed")], rec(35.0, 21, 0.9), False))  # nothing retaken
    ticks += [([], rec(36.0 + i, 22 + i, 0.9, wait=0.1), False) for i in range(30)]
    figures, trackers, _ = replay(ticks)
    assert all(running == pytest.approx(whole, abs=1e-9) for running, whole in figures), figures
