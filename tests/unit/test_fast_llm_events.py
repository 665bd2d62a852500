"""Which Fast-LLM events are acted on: the rules of events.py over recorded event histories."""

from __future__ import annotations

import json

import pytest

from rlrun.backends.fast_llm.events import EventJudge, weights_ready_problem
from rlrun.backends.fast_llm.protocol import TrainingFinished, WeightsReady


def ready(step: int) -> dict:
    return {"event": json.dumps({"type": "weights_ready", "step": step, "documents_seen": 10 * step})}


FINISHED = {"event": json.dumps({"type": "training_finished"})}


def replay(judge: EventJudge, fields: list[dict], start_ms: int = 100) -> list[str]:
    """Each message's fate: "ok", "old" (an earlier trainer's) or "rejected: <why>"."""
    out = []
    for i, f in enumerate(fields):
        event, why = judge.judge(f"{start_ms + i}-0", f)
        out.append("ok" if event is not None else ("old" if why is None else f"rejected: {why}"))
    return out


@pytest.mark.parametrize(
    "step, last, start, skips, problem",
    [
        (0, None, 0, False, None),  # a fresh trainer announces step 0
        (5, None, 5, False, None),  # resumed from checkpoint 5
        (3, None, 5, False, "started from step 5"),
        (12, None, 12, False, None),  # a checkpoint past a lowered train_iters (10): still its start
        (7, None, None, False, None),  # start unknown: any step up to train_iters
        (11, None, None, False, "past train_iters (10)"),
        (6, 5, 5, False, None),
        (5, 5, 5, False, "goes backwards"),
        (2, 5, 5, False, "goes backwards"),
        (7, 5, 5, False, "jumps from step 5 (expected 6)"),
        (7, 5, 5, True, None),  # fp16: Fast-LLM skipped an update
        (11, 10, 5, True, "past train_iters (10)"),
    ],
)
def test_weights_ready_fits_the_attempt(step, last, start, skips, problem):
    got = weights_ready_problem(step, last_step=last, start_step=start, train_iters=10, skips_possible=skips)
    assert (got is None) if problem is None else (problem in got)


def test_a_run_with_forged_events_keeps_the_real_sequence():
    judge = EventJudge(train_iters=10)
    judge.new_attempt("99-0", start_step=0)
    fates = replay(judge, [
        ready(0), ready(1),
        ready(9),  # forged: jumps
        ready(0),  # forged: goes backwards
        {"event": json.dumps({"type": "reload", "path": "/tmp/evil"})},  # forged: unknown type
        {"data": "{}"},  # not an event at all
        ready(2), FINISHED,
        FINISHED,  # a second one
    ])  # fmt: skip
    assert fates[:2] == ["ok", "ok"] and fates[6:8] == ["ok", "ok"]
    assert [f.split(":")[0] for f in fates[2:6]] == ["rejected"] * 4
    assert "jumps" in fates[2] and "backwards" in fates[3] and "unknown event type 'reload'" in fates[4]
    assert "second training_finished" in fates[8]
    assert judge.attempt.last_step == 2 and judge.attempt.finished


def test_events_of_an_earlier_trainer_are_not_judged_and_a_new_attempt_starts_over():
    judge = EventJudge(train_iters=10)
    judge.new_attempt("100-0", start_step=0)
    assert replay(judge, [ready(0), ready(1), ready(2)], start_ms=101) == ["ok"] * 3
    judge.new_attempt("103-0", start_step=1)  # restarted from checkpoint 1: backwards is right here
    assert replay(judge, [ready(7), ready(1), ready(2)], start_ms=103) == ["old", "ok", "ok"]
    assert judge.attempt.last_step == 2 and not judge.attempt.finished


def test_training_finished_needs_a_weights_ready_of_the_same_trainer():
    judge = EventJudge(train_iters=10)
    judge.new_attempt("1-0", start_step=4)
    (fate,) = replay(judge, [FINISHED])
    assert fate.startswith("rejected") and not judge.attempt.finished
    assert replay(judge, [ready(4), FINISHED, ready(5)], start_ms=200) == ["ok", "ok", "ok"]
    assert not judge.attempt.finished  # a weights_ready after it: training again


def test_accepted_events_are_the_protocol_objects():
    judge = EventJudge(train_iters=3)
    assert judge.judge("5-0", ready(0)) == (WeightsReady(step=0, documents_seen=0), None)
    assert judge.judge("6-0", FINISHED) == (TrainingFinished(), None)
