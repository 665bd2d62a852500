"""bench/faults.py's pure rules: the seeded kill schedule, which processes a role names, and which
recorded failure belongs to which kill."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlrun.telemetry.ettr import FailureCost

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults  # noqa: E402 - bench/ is not a package


def test_a_kill_every_period_strictly_before_the_end():
    plan = faults.schedule(15, 5, ["vllm", "actor", "trainer"], seed=0)
    assert [k.at_s for k in plan] == [300.0, 600.0]  # none at 15 min: the run ends there
    assert [k.at_s for k in faults.schedule(6, 2, ["actor"], seed=0)] == [120.0, 240.0]
    assert [k.at_s for k in faults.schedule(16, 5, ["actor"], seed=0)] == [300.0, 600.0, 900.0]


def test_the_roles_drawn_depend_on_the_seed_only():
    roles = ["vllm", "actor", "trainer"]
    draws = {seed: [k.role for k in faults.schedule(60, 1, roles, seed)] for seed in range(3)}
    assert draws[0] == [k.role for k in faults.schedule(60, 1, roles, 0)]
    assert len({tuple(d) for d in draws.values()}) > 1
    for drawn in draws.values():  # every role once before any twice
        assert set(drawn[:3]) == set(roles) and set(drawn[3:6]) == set(roles)


@pytest.mark.parametrize("minutes,every", [(0, 5), (15, 0), (15, -1)])
def test_a_schedule_needs_positive_times(minutes, every):
    with pytest.raises(ValueError):
        faults.schedule(minutes, every, ["actor"], 0)


def test_a_role_names_its_processes():
    events = [
        {"event": "process_started", "process": name, "time": 1.0}
        for name in ("redis", "vllm-0", "vllm-1", "trainer", "actor")
    ]
    assert faults.process_names(events, "vllm") == ["vllm-0", "vllm-1"]
    assert faults.process_names(events, "trainer") == ["trainer"]
    assert faults.process_names(events[:1], "actor") == []


def _failure(process: str, t: float) -> FailureCost:
    return FailureCost(process, t, "killed by SIGKILL", 3.0, 0, 0, 0)


def test_a_failure_belongs_to_the_kill_of_its_process_just_before_it():
    failures = [_failure("actor", 100.4), _failure("vllm-0", 200.6), _failure("actor", 400.0)]
    assert faults.failure_of({"process": "actor", "time": 100.0}, failures) is failures[0]
    assert faults.failure_of({"process": "vllm-0", "time": 200.0}, failures) is failures[1]
    assert faults.failure_of({"process": "trainer", "time": 100.0}, failures) is None
    assert faults.failure_of({"process": "actor", "time": 390.0}, failures) is None  # too long after: not this kill's


def test_restart_time_is_failed_to_ready():
    events = [
        {"event": "process_failed", "process": "vllm-0", "time": 10.5},
        {"event": "process_restarted", "process": "vllm-0", "time": 11.5},
        {"event": "process_ready", "process": "vllm-0", "time": 50.5},
    ]
    assert faults.restart_s(events, {"process": "vllm-0", "time": 10.0}) == pytest.approx(40.0)
    assert faults.restart_s(events[:2], {"process": "vllm-0", "time": 10.0}) is None
