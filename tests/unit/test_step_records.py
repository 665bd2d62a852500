"""metrics.jsonl holds records of several kinds (`{"kind": "eval", ...}` beside the steps'): every
reader of step records takes those without a `kind` or of kind "step", and no other."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlrun.cli.plot import plot_run
from rlrun.cli.status import recent_reward
from rlrun.rundir import RunDir
from rlrun.telemetry.metrics import is_step_record, read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import learning_curve  # noqa: E402 - bench/ is not a package
import step_time  # noqa: E402

T0 = 1_800_000_000.0


def step(n: int, **extra) -> dict:
    return {"step": n, "samples": 8 * n, "reward_mean": 0.5, "reward_std": 0.1, "tokens": 100, "time": T0 + 2.0 * n,
            "step_time_s": 2.0, "wait_s": 0.5, "weights_s": 0.5, **extra}  # fmt: skip


# An evaluation's record, as the evaluation will write it: a `step`, a `reward_mean` and a `time` of
# its own, so only its kind tells it from a step's.
EVAL = {"kind": "eval", "version": 3, "step": 3, "reward_mean": 0.0, "samples": 999, "tokens": 0, "time": T0 + 7.0, "step_time_s": 60.0}
OTHER = {"kind": "something-later", "step": 4, "reward_mean": 0.0, "time": T0 + 9.0}


def write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("record, counted", [
    ({"step": 1}, True), ({"kind": "step", "step": 1}, True), (EVAL, False), (OTHER, False), ({"kind": None, "step": 1}, False),
])  # fmt: skip
def test_a_record_is_a_steps_without_a_kind_or_of_kind_step(record, counted):
    assert is_step_record(record) is counted


def test_read_metrics_skips_the_records_of_other_kinds(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, [step(1), step(2, kind="step"), EVAL, step(3), OTHER])
    assert [(r["step"], r["samples"]) for r in read_metrics(path)] == [(1, 8), (2, 16), (3, 24)]


def test_status_plot_and_the_benchmarks_read_the_steps_alone(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"kind": "rlrun-run"})
    write(run_dir.metrics, [step(1), step(2), EVAL, step(3), OTHER])
    records = read_metrics(run_dir.metrics)
    assert recent_reward(records) == (0.5, 3)  # the evaluation's 0.0 is not averaged in
    assert plot_run(run_dir).steps == 3
    assert [r["step"] for r in learning_curve.final_steps(learning_curve.read_jsonl(run_dir.metrics))] == [1, 2, 3]
    assert [r["samples"] for r in step_time.read_metrics(run_dir.metrics)] == [8, 16, 24]
