"""Held-out evaluation: its rules (rlrun/task/evaluation.py: which versions, pass@k, the figures of
one evaluation) and the trainer's gate (rlrun/trainer/eval_gate.py) over a stand-in Redis."""

from __future__ import annotations

import itertools
import json
import logging
import threading
from fractions import Fraction

import pytest

from rlrun.config.schema import EvalConfig
from rlrun.streams import names
from rlrun.task.evaluation import PromptResult, due_versions, is_due, pass_at_k, summarize
from rlrun.trainer import eval_gate
from rlrun.trainer.eval_gate import EvalGate
from rlrun.trainer.stopping import Stopping

# --- pass@k -----------------------------------------------------------------------------------------


def brute_force_pass_at_k(n: int, correct: int, k: int) -> Fraction:
    """The share of the k-subsets of n samples (the first `correct` of them right) holding a right one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(1 for s in subsets if min(s) < correct), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n):
    for correct in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, correct, k) == pytest.approx(float(brute_force_pass_at_k(n, correct, k)), abs=1e-12), (n, correct, k)


def test_pass_at_1_is_the_share_correct():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


@pytest.mark.parametrize("n, correct, k", [(4, 1, 0), (4, 1, 5), (4, 5, 2), (4, -1, 2), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_counts(n, correct, k):
    with pytest.raises(ValueError, match="needs 0 < k <= n"):
        pass_at_k(n, correct, k)


# --- summarize ----------------------------------------------------------------------------------------


def documented(figures: dict) -> dict:
    """The figures an eval record documents (docs/your-task.md); others may come beside them."""
    return {key: figures[key] for key in ("prompts", "k", "reward_mean", "pass@1", f"pass@{figures['k']}")}


def test_summarize_one_source():
    results = [PromptResult([1.0, 0.0, 0.0, 0.0]), PromptResult([0.0, 0.0, 0.0, 0.0]), PromptResult([1.0, 1.0, 0.5, 1.0])]
    figures = summarize(results, threshold=1.0)
    assert documented(figures) == {
        "prompts": 3,
        "k": 4,
        "reward_mean": round(4.5 / 12, 6),
        "pass@1": round((1 / 4 + 0 + 3 / 4) / 3, 6),
        "pass@4": round(2 / 3, 6),
    }


def test_summarize_the_threshold_says_what_is_correct():
    results = [PromptResult([0.6, 0.4])]
    assert summarize(results, threshold=0.5)["pass@1"] == 0.5
    assert summarize(results, threshold=0.7)["pass@2"] == 0.0
    assert summarize(results, threshold=0.4)["pass@1"] == 1.0  # at least the threshold counts


def test_summarize_per_source_when_there_are_several():
    results = [PromptResult([1.0, 1.0], "easy"), PromptResult([1.0, 0.0], "easy"), PromptResult([0.0, 0.0], "hard")]
    figures = summarize(results, threshold=1.0)
    assert figures["prompts"] == 3 and figures["pass@1"] == round((1 + 0.5 + 0) / 3, 6)
    assert {source: documented(f) for source, f in figures["per_source"].items()} == {
        "easy": {"prompts": 2, "k": 2, "reward_mean": 0.75, "pass@1": 0.75, "pass@2": 1.0},
        "hard": {"prompts": 1, "k": 2, "reward_mean": 0.0, "pass@1": 0.0, "pass@2": 0.0},
    }


def test_summarize_no_per_source_for_a_single_source():
    assert "per_source" not in summarize([PromptResult([1.0], "only"), PromptResult([0.0], "only")], 1.0)


def test_summarize_refuses_no_prompts_and_uneven_samples():
    with pytest.raises(ValueError, match="at least one prompt"):
        summarize([], 1.0)
    with pytest.raises(ValueError, match="same number of samples"):
        summarize([PromptResult([1.0, 0.0]), PromptResult([1.0])], 1.0)
    with pytest.raises(ValueError, match="same number of samples"):
        summarize([PromptResult([])], 1.0)


# --- which versions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "every, at_start, last, due",
    [
        (0, True, 10, []),
        (3, True, 10, [0, 3, 6, 9]),
        (3, False, 10, [3, 6, 9]),
        (5, False, 10, [5, 10]),
        (20, False, 10, []),
        (1, True, 2, [0, 1, 2]),
    ],
)
def test_is_due(every, at_start, last, due):
    cfg = EvalConfig(every_steps=every, at_start=at_start)
    assert [v for v in range(-2, last + 5) if is_due(v, cfg, last)] == due
    assert due_versions(cfg, last) == due


# --- the trainer's gate ------------------------------------------------------------------------------------


class FakeRedis:
    """The evaluation results hash; `appears` holds results actor 0 writes after that many reads."""

    def __init__(self, results: dict[str, str] | None = None, appears: dict[str, tuple[int, str]] | None = None) -> None:
        self.results = dict(results or {})
        self.appears = dict(appears or {})
        self.reads: list[tuple[str, str]] = []

    def hget(self, key, field):
        self.reads.append((key, field))
        if field in self.appears:
            after, value = self.appears[field]
            if sum(1 for _, f in self.reads if f == field) > after:
                self.results[field] = value
        return self.results.get(field)


RESULT = {"version": 4, "reward_mean": 0.5, "pass@1": 0.5, "pass@2": 0.75, "k": 2, "prompts": 4, "eval_s": 1.5}


class Gate:
    """An EvalGate over a FakeRedis, its writes, heartbeats and a clock that moves 1 s per reading."""

    def __init__(self, redis: FakeRedis, every: int = 2, wait_s: float = 10.0, last: int = 10) -> None:
        self.redis, self.written, self.heartbeats = redis, [], []
        self.now = 0.0
        self.stopping = Stopping(redis, threading.Event())
        self.gate = EvalGate(
            EvalConfig(every_steps=every, wait_s=wait_s), last, self.stopping, lambda **kw: self.heartbeats.append(kw), self.written.append,
            clock=self.tick,
        )  # fmt: skip

    def tick(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture(autouse=True)
def no_polling_pause(monkeypatch):
    monkeypatch.setattr(eval_gate, "POLL_S", 0.0)


def test_the_gate_waits_until_the_result_appears_and_records_it():
    gate = Gate(FakeRedis(appears={"4": (3, json.dumps(RESULT))}))
    gate.gate.wait_for(4)
    assert gate.redis.reads == [(names.EVAL_RESULTS, "4")] * 4
    assert len(gate.heartbeats) == 3 and all("policy version 4" in h["waiting_for"] for h in gate.heartbeats)
    assert gate.written == [{"kind": "eval", "step": 4, "policy_version": 4, **{k: v for k, v in RESULT.items() if k != "version"}}]


def test_the_gate_writes_one_record_per_version():
    gate = Gate(FakeRedis({"4": json.dumps(RESULT), "6": json.dumps({**RESULT, "version": 6, "reward_mean": 0.75})}))
    for version in (4, 4, 6, 4, 6):
        gate.gate.wait_for(version)
    assert [(r["policy_version"], r["reward_mean"]) for r in gate.written] == [(4, 0.5), (6, 0.75)]
    assert len(gate.redis.reads) == 2  # a recorded version is not asked for again


@pytest.mark.parametrize("version", [3, 5, 12, -1], ids=["odd", "odd-again", "past-the-last", "negative"])
def test_the_gate_skips_a_version_not_due(version):
    gate = Gate(FakeRedis({str(version): json.dumps(RESULT)}), every=2, last=10)
    gate.gate.wait_for(version)
    assert gate.redis.reads == [] and gate.written == []


def test_the_gate_gives_up_after_wait_s(caplog):
    gate = Gate(FakeRedis(), wait_s=5.0)
    with caplog.at_level(logging.WARNING, "rlrun.trainer"):
        gate.gate.wait_for(4)
    # the deadline is the first reading (1 s) + 5 s; it gives up on the first reading past it
    assert gate.now == 7.0 and gate.written == []
    assert "no evaluation of policy version 4 after eval.wait_s=5 s" in caplog.text
    reads = len(gate.redis.reads)
    gate.gate.wait_for(4)  # given up on: the weights move on without asking again
    assert len(gate.redis.reads) == reads


def test_an_abandoned_evaluation_writes_nothing(caplog):
    gate = Gate(FakeRedis({"4": json.dumps({"version": 4, "abandoned": "the eval rows' weights changed mid-evaluation"})}))
    with caplog.at_level(logging.WARNING, "rlrun.trainer"):
        gate.gate.wait_for(4)
        gate.gate.wait_for(4)
    assert gate.written == [] and len(gate.redis.reads) == 1
    assert "evaluation of policy version 4 abandoned: the eval rows' weights changed" in caplog.text


def test_the_gate_stops_waiting_when_the_trainer_is_asked_to_stop():
    gate = Gate(FakeRedis())
    gate.stopping.requested.set()
    gate.gate.wait_for(4)
    assert len(gate.redis.reads) == 1 and gate.written == [] and gate.heartbeats == []
