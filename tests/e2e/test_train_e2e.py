"""The real stack end to end: `rlrun train` starts Redis, vLLM (CPU), the trainer and the actor,
trains the tiny model, stops by itself, and leaves nothing running."""

from __future__ import annotations

import json

import pytest

from rlrun.trainer.checkpoint import latest_complete, read_state

from .conftest import read_jsonl, run_cli

pytestmark = pytest.mark.e2e

STEPS = 6


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    result = run_cli(
        ["train", "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.checkpoint_every=4",
         f"run.dir={run_dir}", "supervisor.stop_grace_s=5"],
        timeout=600,
    )  # fmt: skip
    return result, run_dir


def test_exits_0_at_exactly_max_train_steps(short_run):
    result, run_dir = short_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    samples_per_step = 256
    assert metrics[-1]["samples"] == STEPS * samples_per_step
    # checkpoints at step 4 and at the end; the final one holds exactly max_train_steps
    final = latest_complete(run_dir / "checkpoints")
    assert final is not None and read_state(final).step == STEPS
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"
    assert "finished" in result.stdout


def test_vllm_served_updated_weights(short_run):
    """The actor tags every token with the policy version vLLM served; it must have advanced."""
    _, run_dir = short_run
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics[0]["behaviour_version_max"] == 0
    assert metrics[-1]["behaviour_version_max"] >= STEPS - 3  # at most a couple of versions behind
    assert metrics[-1]["policy_version"] == STEPS


def test_processes_started_in_order_and_nothing_is_left(short_run):
    result, run_dir = short_run
    events = read_jsonl(run_dir / "events.jsonl")
    started = [e["process"] for e in events if e["event"] == "process_started"]
    assert started == ["redis", "vllm-0", "trainer", "actor"]
    assert events[-1] == {**events[-1], "event": "run_stopped", "status": "finished"}
    assert result.left_behind == []


def test_run_directory_holds_logs_config_and_private_secrets(short_run):
    _, run_dir = short_run
    for name in ("redis", "vllm-0", "trainer", "actor"):
        assert (run_dir / "logs" / f"{name}.log").is_file()
    assert (run_dir / "config.yaml").is_file() and "recipe=math_grpo" in (run_dir / "overrides.yaml").read_text()
    assert (run_dir / "secrets" / "redis.password").stat().st_mode & 0o077 == 0
    assert any((run_dir / "redis").rglob("*.aof*"))


def test_a_second_train_into_the_same_directory_is_refused(short_run):
    result, run_dir = short_run
    listing = sorted(p.name for p in run_dir.iterdir())
    again = run_cli(["train", f"run.dir={run_dir}"], timeout=60)
    assert again.returncode == 4
    assert "already holds a run" in again.stderr and "rlrun resume" in again.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == listing
