"""`rlrun resume` on the real stack: a run stopped by Ctrl-C, then one whose rlrun was SIGKILLed,
is continued to exactly `max_train_steps`; every group is trained exactly once, and generations
in flight at each stop are continued from the journal, not regenerated."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from rlrun.trainer.checkpoint import latest_complete, read_state

from .conftest import check_exact_continuation, in_flight_tokens, left_behind, read_jsonl, run_cli, start_rlrun, steps_done, wait_for

pytestmark = pytest.mark.e2e

STEPS = 6
CONFIG = [
    "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.train_batch_size=64", "trainer.checkpoint_every=2",
    "actor.max_new_tokens=48", "actor.min_new_tokens=40", "actor.audit=true", "actor.max_prefix_staleness=1000",
    "actor.journal_flush_tokens=1", "actor.max_concurrent_groups=8", "supervisor.stop_grace_s=5",
]  # fmt: skip


def resume(run_dir, *overrides, timeout=900) -> subprocess.CompletedProcess:
    return run_cli(["resume", str(run_dir), *overrides], timeout=timeout)


@pytest.fixture(scope="module")
def interrupted_twice(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    stops = {}

    # 1. Ctrl-C once a checkpoint exists and generations are in flight.
    proc = start_rlrun(run_dir, *CONFIG)
    try:
        wait_for(lambda: latest_complete(run_dir / "checkpoints") is not None and in_flight_tokens(run_dir) > 100, 600, "a checkpoint and tokens in flight", proc)
        stops["ctrl_c"] = time.time()
        proc.send_signal(signal.SIGINT)
        stops["ctrl_c_code"] = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stops["after_ctrl_c"] = json.loads((run_dir / "state.json").read_text())["status"]

    # 2. Resume, then SIGKILL rlrun itself (its children die with it) a few steps later.
    stops["left_after_ctrl_c"] = left_behind(proc)
    proc = start_rlrun(run_dir, command="resume")
    try:
        mark = steps_done(run_dir)
        wait_for(lambda: steps_done(run_dir) >= mark + 1 and in_flight_tokens(run_dir) > 100, 600, "progress after resuming", proc)
        # A second resume of the running run: refused at once (the run's lock), nothing touched.
        owned = {name: (run_dir / name).read_bytes() for name in ("config.yaml", "overrides.yaml", "state.json")}
        launches = sorted(p.name for p in (run_dir / "logs").iterdir())
        stops["second_resume"] = resume(run_dir, "trainer.max_train_steps=80", timeout=60)
        stops["second_resume_changed"] = [n for n, data in owned.items() if (run_dir / n).read_bytes() != data]
        stops["second_resume_changed"] += [] if sorted(p.name for p in (run_dir / "logs").iterdir()) == launches else ["logs/"]
        stops["first_resume_pid"] = proc.pid
        assert proc.poll() is None, "the running resume must not be disturbed by the refused one"
        stops["sigkill"] = time.time()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    stops["left_after_sigkill"] = left_behind(proc, grace_s=10)

    # 3. Resume to the end.
    final = resume(run_dir)
    return run_dir, stops, final


def test_ctrl_c_stops_in_order_and_says_how_to_continue(interrupted_twice):
    _, stops, _ = interrupted_twice
    assert stops["ctrl_c_code"] == 130
    assert stops["after_ctrl_c"] == "interrupted"
    assert stops["left_after_ctrl_c"] == []
    assert stops["left_after_sigkill"] == []  # SIGKILL of rlrun took its children with it


def test_a_second_resume_of_a_running_run_exits_4_and_changes_nothing(interrupted_twice):
    _, stops, _ = interrupted_twice
    second = stops["second_resume"]
    assert second.returncode == 4, second.stderr[-2000:]
    assert f"is being run right now by rlrun (pid {stops['first_resume_pid']})" in " ".join(second.stderr.split())
    assert stops["second_resume_changed"] == [] and second.left_behind == []  # the first one ran on to its SIGKILL


def test_resumed_run_completes_at_exactly_max_train_steps(interrupted_twice):
    run_dir, _, final = interrupted_twice
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"
    assert final.left_behind == []


def test_every_group_is_trained_exactly_once_across_resumes(interrupted_twice):
    run_dir, _, _ = interrupted_twice
    delivered = {r["group_id"] for r in read_jsonl(run_dir / "audit" / "actor.jsonl") if r["kind"] == "delivered"}
    final_steps = {}
    for line in read_jsonl(run_dir / "trained_groups.jsonl"):
        final_steps[line["step"]] = line["groups"]  # steps after the last checkpoint are trained again
    trained = [g for groups in final_steps.values() for g in groups]
    assert sorted(final_steps) == list(range(1, STEPS + 1))
    assert len(trained) == len(set(trained)) and set(trained) <= delivered


def test_in_flight_generations_were_continued_not_regenerated(interrupted_twice):
    run_dir, stops, _ = interrupted_twice
    spanned = [check_exact_continuation(run_dir, stops[s])["spanning"] for s in ("ctrl_c", "sigkill")]
    assert sum(spanned) > 0
    resumed_logs = [p.read_text() for p in (run_dir / "logs").rglob("actor*.log")]
    assert any("replaying the journal" in text for text in resumed_logs)


def test_resuming_a_finished_run_starts_nothing(interrupted_twice):
    run_dir, _, _ = interrupted_twice
    events_before = (run_dir / "events.jsonl").read_text()
    again = resume(run_dir, timeout=60)
    assert again.returncode == 0 and "already finished" in again.stdout
    assert (run_dir / "events.jsonl").read_text() == events_before


def test_a_disallowed_override_is_refused_and_changes_nothing(interrupted_twice):
    run_dir, _, _ = interrupted_twice
    config_before = (run_dir / "config.yaml").read_text()
    refused = resume(run_dir, "algo.group_size=4", timeout=60)
    assert refused.returncode == 2 and "cannot be changed when resuming" in refused.stderr
    assert (run_dir / "config.yaml").read_text() == config_before


def test_resume_of_something_that_is_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    result = resume(tmp_path, timeout=60)
    assert result.returncode == 4 and "not an rlrun run directory" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_inspect_checkpoint_on_the_resumed_run(interrupted_twice):
    run_dir, _, _ = interrupted_twice
    report = run_cli(["inspect-checkpoint", str(run_dir), "--json"], timeout=60)
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert (data["layout"], data["step"], data["complete"]) == ("hf", STEPS, True)
    assert data["samples_processed"] == STEPS * 64 and data["selected_from_run"]


def test_each_launch_keeps_its_own_logs_side_by_side(interrupted_twice):
    """train, resume, resume: three log folders; every process start of a launch logs into its
    own launch's folder, no file is written by two starts, and each trainer log holds one start."""
    from pathlib import Path

    run_dir, _, final = interrupted_twice
    assert final.returncode == 0
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["launch-1", "launch-2", "launch-3"]
    events = read_jsonl(run_dir / "events.jsonl")
    launch, used = None, []
    for event in events:
        if event["event"] in ("run_started", "run_resumed"):
            launch = event["launch"]
        elif event["event"] in ("process_started", "process_restarted"):
            assert Path(event["log"]).parent == run_dir / "logs" / f"launch-{launch}", event
            used.append(event["log"])
    assert [e["launch"] for e in events if e["event"] in ("run_started", "run_resumed")] == [1, 2, 3]
    assert len(used) == len(set(used)), "a log file was written by two process starts"
    for n in (1, 2, 3):
        names = {p.name for p in (run_dir / "logs" / f"launch-{n}").iterdir()}
        assert {"redis.log", "vllm-0.log", "trainer.log", "actor.log"} <= names
        trainer = (run_dir / "logs" / f"launch-{n}" / "trainer.log").read_text()
        assert trainer.count("resumed from") == (0 if n == 1 else 1), f"launch {n}: {trainer[-2000:]}"
    newest = run_cli(["logs", str(run_dir), "-c", "trainer"], timeout=60)
    first = run_cli(["logs", str(run_dir), "-c", "trainer", "--launch", "1"], timeout=60)
    assert newest.stdout == (run_dir / "logs" / "launch-3" / "trainer.log").read_text()
    assert first.stdout == (run_dir / "logs" / "launch-1" / "trainer.log").read_text() != newest.stdout
