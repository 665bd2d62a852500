"""Supervision on the real stack: processes killed or frozen mid-run are detected and restarted,
and the run still completes at exactly `max_train_steps`; rlrun's own death leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from rlrun.trainer.checkpoint import latest_complete, read_state

from .conftest import left_behind, read_jsonl, start_rlrun

pytestmark = pytest.mark.e2e

STEPS = 24


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return read_jsonl(path) if path.is_file() else []


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return max((m["step"] for m in read_jsonl(path)), default=0) if path.is_file() else 0


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"rlrun exited ({proc.returncode}) while waiting for {what}")
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def current_pid(run_dir: Path, process: str) -> int:
    """The pid of the process itself (the child of the guard that leads its group)."""
    started = [e for e in events(run_dir) if e["event"] in ("process_started", "process_restarted") and e["process"] == process]
    guard = psutil.Process(started[-1]["pid"])
    return guard.children()[0].pid


def restarts(run_dir: Path, process: str) -> int:
    return sum(1 for e in events(run_dir) if e["event"] == "process_restarted" and e["process"] == process)


def ready_count(run_dir: Path, process: str) -> int:
    return sum(1 for e in events(run_dir) if e["event"] == "process_ready" and e["process"] == process)


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory):
    """One run in which vLLM, the actor and the trainer are SIGKILLed and the actor is frozen."""
    run_dir = tmp_path_factory.mktemp("chaos") / "run"
    proc = start_rlrun(
        run_dir, "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.checkpoint_every=4",
        "supervisor.actor.stall_timeout_s=10", "supervisor.stop_grace_s=5",
    )  # fmt: skip
    timeline = {}
    try:
        wait_for(lambda: steps_done(run_dir) >= 2, 600, "step 2", proc)
        os.kill(current_pid(run_dir, "vllm-0"), signal.SIGKILL)
        timeline["vllm_killed"] = time.time()
        wait_for(lambda: ready_count(run_dir, "vllm-0") >= 2, 600, "vLLM to be ready again", proc)

        mark = steps_done(run_dir)
        wait_for(lambda: steps_done(run_dir) >= mark + 2, 300, "progress after the vLLM restart", proc)
        os.kill(current_pid(run_dir, "actor"), signal.SIGKILL)
        wait_for(lambda: restarts(run_dir, "actor") >= 1, 120, "the actor restart", proc)

        wait_for(lambda: latest_complete(run_dir / "checkpoints") is not None, 300, "a first checkpoint", proc)
        timeline["checkpoint_step_at_kill"] = read_state(latest_complete(run_dir / "checkpoints")).step
        os.kill(current_pid(run_dir, "trainer"), signal.SIGKILL)
        wait_for(lambda: restarts(run_dir, "trainer") >= 1, 120, "the trainer restart", proc)

        mark = steps_done(run_dir)
        wait_for(lambda: steps_done(run_dir) >= min(mark + 1, STEPS), 300, "progress after the trainer restart", proc)
        if steps_done(run_dir) < STEPS:
            os.kill(current_pid(run_dir, "actor"), signal.SIGSTOP)
            timeline["actor_stopped"] = time.time()
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (run_dir.parent / "rlrun.out").read_text()
    return proc.returncode, run_dir, left_behind(proc), timeline, output


def test_the_run_completes_at_exactly_max_train_steps_after_every_kill(chaos_run):
    code, run_dir, _, _, output = chaos_run
    assert code == 0, output[-4000:]
    final = latest_complete(run_dir / "checkpoints")
    assert read_state(final).step == STEPS
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "finished"


def test_killed_vllm_is_restarted_alone(chaos_run):
    _, run_dir, _, _, _ = chaos_run
    evs = events(run_dir)
    failed = [e for e in evs if e["event"] == "process_failed" and e["process"] == "vllm-0"]
    assert failed and "killed by SIGKILL" in failed[0]["reason"] and failed[0]["action"] == "restart"
    # Redis was never restarted for it: one start, no restart
    assert restarts(run_dir, "redis") == 0
    assert (run_dir / "logs" / "launch-1" / "vllm-0.1.log").is_file()  # the restart logs to its own file


def test_killed_trainer_resumes_from_its_checkpoint(chaos_run):
    _, run_dir, _, timeline, _ = chaos_run
    log = (run_dir / "logs" / "launch-1" / "trainer.1.log").read_text()
    assert "resumed from" in log and f"at step {timeline['checkpoint_step_at_kill']}" in log


def test_killed_actor_is_restarted(chaos_run):
    _, run_dir, _, _, _ = chaos_run
    failed = [e for e in events(run_dir) if e["event"] == "process_failed" and e["process"] == "actor"]
    assert failed and "killed by SIGKILL" in failed[0]["reason"]


def test_a_frozen_process_is_reported_as_stalled_and_recovered(chaos_run):
    _, run_dir, _, timeline, _ = chaos_run
    if "actor_stopped" not in timeline:
        pytest.skip("the run finished before the actor could be frozen")
    stalled = [e for e in events(run_dir) if e["event"] == "process_stalled"]
    assert stalled and stalled[0]["process"] == "actor"
    # reported within its 10 s timeout (+ heartbeat freshness 5 s + a poll)
    assert stalled[0]["time"] - timeline["actor_stopped"] < 10 + 5 + 2
    assert restarts(run_dir, "actor") >= 2


def test_the_fault_matrix_reports_ettr_and_the_work_lost_per_failure(chaos_run):
    from rlrun.ettr import split_wall_time
    from rlrun.metrics import read_metrics

    _, run_dir, _, timeline, _ = chaos_run
    split = split_wall_time(events(run_dir), read_metrics(run_dir / "metrics.jsonl"))
    print(f"\nchaos run: ETTR {split.ettr:.2f} of {split.wall_s:.0f} s; {json.dumps({k: round(v, 1) for k, v in split.seconds.items()})}")
    for f in split.failures:
        print(f"  {f.process}: {f.reason} -> recovery {f.recovery_s} s, {f.steps_retaken} steps retaken, {f.tokens_regenerated} tokens regenerated")
    assert {"vllm-0", "actor", "trainer"} <= {f.process for f in split.failures}
    assert all(f.recovery_s is not None and f.recovery_s > 0 for f in split.failures)  # each one recovered
    # the trainer restarts from its checkpoint: whatever it had recorded past it is taken again
    recorded = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert split.steps_retaken == len(recorded) - len(set(recorded))
    assert sum(split.seconds.values()) == pytest.approx(split.wall_s, abs=0.1) and 0 < split.ettr < 1


def test_nothing_is_left_after_the_chaos_run(chaos_run):
    _, _, left, _, _ = chaos_run
    assert left == []


def test_sigkill_of_rlrun_itself_leaves_no_process_of_the_run(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_rlrun(run_dir, "trainer.max_train_steps=200")
    try:
        wait_for(lambda: steps_done(run_dir) >= 1, 600, "step 1", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(proc.run_processes.seen) >= 8  # guards, redis, vllm (+ engine core), trainer, actor
    assert left_behind(proc, grace_s=5.0) == []
