"""trainer=fast_llm on the real stack, with the stand-in trainer (tests/fast_llm_standin.py) in
Fast-LLM's place: it speaks Fast-LLM's Redis protocol and overshoots docs_per_step like it.

One run goes through the scaled-down seed scenario plus two interruptions: the stand-in dies
while writing a checkpoint (a half-written checkpoint, moved aside before its restart), and it
is sent SIGTERM mid-run (it then announces `training_finished`, which is not completion)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from rlrun.rules import completion
from rlrun.backends.fast_llm.checkpoints import latest_complete_step
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams.server import connect
from tests.standalone_redis import managed_server

from .conftest import current_pid, events, left_behind, read_jsonl, start_rlrun, wait_for

pytestmark = pytest.mark.e2e

STEPS = 8
DOCS_PER_STEP = 16  # with 128-token micro-batches of ~10-token documents: ~24 documents per step
STANDIN = Path(__file__).parent.parent / "fast_llm_standin.py"


def steps_trained(log: Path) -> set[int]:
    """The steps in the stand-in's trained log so far."""
    return {record["step"] for record in read_jsonl(log)} if log.is_file() else set()


@pytest.fixture(scope="module")
def fast_llm_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fast_llm") / "run"
    trained = run_dir.parent / "trained.jsonl"
    command = json.dumps([sys.executable, str(STANDIN), "--config", "{config}", "--data-parallel", "1",
                          "--crash-in-checkpoint", "4", "--step-delay", "0.5", "--trained-log", str(trained),
                          "--hold-after-step", "6"])  # fmt: skip
    proc = start_rlrun(
        run_dir, "trainer=fast_llm", "trainer.device=cpu", "recipe=math_grpo", f"trainer.max_train_steps={STEPS}",
        f"trainer.train_batch_size={DOCS_PER_STEP}", "trainer.checkpoint_every=2", "trainer.fast_llm.micro_batch_size=128",
        f"trainer.fast_llm.command={command}", "supervisor.stop_grace_s=10",
    )  # fmt: skip
    try:
        # past the crash in checkpoint 4 and its restart, then SIGTERM at step 6, where the
        # stand-in holds until signalled (--hold-after-step): with 0.5 s steps it would otherwise
        # finish steps 7 and 8, and the run, in about a second, the window a late signal had to hit
        interrupted_at = 6
        wait_for(lambda: interrupted_at in steps_trained(trained), 900, f"Fast-LLM step {interrupted_at}", proc)
        os.kill(current_pid(run_dir, "trainer"), signal.SIGTERM)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    with managed_server(RunDir(run_dir)) as srv:  # read the events back from the run's AOF
        client = connect(srv.url, srv.password)
        fast_llm_events = [json.loads(f["event"]) for _id, f in client.xrange("fast_llm_events")]
        served = {"policy_version": client.get(names.POLICY_VERSION), **client.hgetall(names.WEIGHTS_STATE)}
        served["stream"] = [entry_id for entry_id, _ in client.xrange("fast_llm_streaming")]
    return proc.returncode, run_dir, fast_llm_events, interrupted_at, left_behind(proc), served


def test_the_run_ends_at_exactly_train_iters(fast_llm_run):
    code, run_dir, fl_events, _, left, _ = fast_llm_run
    assert code == 0, (run_dir.parent / "rlrun.out").read_text()[-3000:]
    assert latest_complete_step(run_dir / "fast_llm") == STEPS
    assert fl_events[-1]["type"] == "training_finished"
    assert left == []


def test_the_sample_counting_rule_would_have_stopped_it_early(fast_llm_run):
    _, _, fl_events, _, _, _ = fast_llm_run
    seen = {}
    for event in fl_events:
        if event["type"] == "weights_ready" and event.get("documents_seen") is not None:
            seen[event["step"]] = event["documents_seen"]  # after a restart, steps repeat: last wins
    assert seen[STEPS] > STEPS * DOCS_PER_STEP  # Fast-LLM overshoots docs_per_step every step
    target = completion.HfTarget(STEPS, DOCS_PER_STEP)
    fired = [
        step for step in sorted(seen)
        if completion.hf_finished(target, completion.TrainerObservation(seen[step], 0, False, step)).finished
    ]  # fmt: skip
    per_step = seen[STEPS] / STEPS
    # The old rule would have declared completion (and stopped feeding) at fired[0] < STEPS;
    # rlrun's rule ended the run at exactly STEPS (test_the_run_ends_at_exactly_train_iters).
    assert fired and fired[0] < STEPS
    assert all(seen[step] < STEPS * DOCS_PER_STEP for step in seen if step < fired[0])
    print(f"sample counting would have stopped at step {fired[0]} of {STEPS} ({per_step:.1f} documents per step)")


def test_a_half_written_checkpoint_was_moved_aside_and_training_resumed_before_it(fast_llm_run):
    _, run_dir, _, _, _, _ = fast_llm_run
    moved = list((run_dir / "fast_llm" / "checkpoint_incomplete").iterdir())
    assert [p.name.split(".")[0] for p in moved] == ["4"]
    assert not (moved[0] / "ok").exists()
    restarted = [e for e in events(run_dir) if e["event"] == "process_restarted" and e["process"] == "trainer"]
    assert len(restarted) == 2  # after the crash in checkpoint 4, after the SIGTERM


def test_training_finished_after_an_interrupt_is_not_completion(fast_llm_run):
    _, run_dir, _, interrupted_at, _, _ = fast_llm_run
    rejected = [e for e in events(run_dir) if e["event"] == "process_failed" and "before its work was done" in e["reason"]]
    assert rejected and f"of {STEPS}" in rejected[0]["reason"] and rejected[0]["action"] == "restart"
    assert interrupted_at < STEPS


def test_inspect_checkpoint_reads_the_stand_ins_fast_llm_checkpoints(fast_llm_run):
    from .conftest import run_cli

    _, run_dir, _, _, _, _ = fast_llm_run
    final = run_cli(["inspect-checkpoint", str(run_dir / "fast_llm" / "checkpoint" / str(STEPS)), "--json"], timeout=60)
    assert final.returncode == 0, final.stderr
    report = json.loads(final.stdout)
    assert (report["layout"], report["step"], report["complete"]) == ("fast_llm", STEPS, True)
    assert report["documents_seen"] > STEPS * DOCS_PER_STEP  # the overshoot, as the stand-in recorded it
    half = next((run_dir / "fast_llm" / "checkpoint_incomplete").iterdir())
    moved = run_cli(["inspect-checkpoint", str(half)], timeout=60)
    assert moved.returncode == 4 and "half-written" in moved.stderr


def test_vllm_loaded_every_broadcast_of_every_trainer_start(fast_llm_run):
    _, run_dir, fl_events, _, _, served = fast_llm_run
    ready = [e for e in fl_events if e["type"] == "weights_ready"]
    assert int(served["policy_version"]) == STEPS  # the actor tagged the last tokens with the final policy
    assert int(served["joins"]) == 3  # one join per trainer start: first, after the crash, after the SIGTERM
    assert int(served["broadcasts_loaded"]) == len(ready) and int(served["broadcasts_failed"]) == 0
    log = (run_dir / "logs" / "launch-1" / "weights.log").read_text()
    assert log.count("vLLM serves step") == len(ready)


def test_the_final_lineage_trained_every_document_once(fast_llm_run):
    """Two restarts (a crash in checkpoint 4, a SIGTERM): before each, the documents group was set
    back to the first document the checkpoint does not cover. The steps of the final lineage
    trained the stream's first documents, each once, none skipped."""
    _, run_dir, _, _, _, served = fast_llm_run
    final: dict[int, list[str]] = {}
    for line in (run_dir.parent / "trained.jsonl").read_text().splitlines():
        record = json.loads(line)
        final[record["step"]] = record["ids"]  # a step taken again replaces the dead lineage's
    ids = [i for step in range(1, STEPS + 1) for i in final[step]]
    assert len(ids) == len(set(ids)) and ids == served["stream"][: len(ids)]
    rewinds = [e for e in events(run_dir) if e["event"] == "documents_rewound"]
    assert len(rewinds) == 3  # the first start and the two restarts
    assert all(r["lost"] == 0 for r in rewinds) and rewinds[0]["checkpoint_step"] is None
    _, _, _, interrupted_at, _, _ = fast_llm_run
    assert rewinds[1]["checkpoint_step"] == 2  # the crash in checkpoint 4: back to 2
    assert rewinds[2]["checkpoint_step"] == interrupted_at < STEPS  # saved when SIGTERMed
    assert rewinds[1]["redelivered"] > 0  # the crash would have lost what was read after checkpoint 2


def test_status_runs_and_the_train_line_show_the_steps_and_documents_fast_llm_announced(fast_llm_run):
    """Fast-LLM writes no trainer state and no metrics.jsonl: what `rlrun status`, `rlrun runs` and
    the plain `[train]` line show is read from its weights_ready events (they showed step 0)."""
    from .conftest import run_cli

    code, run_dir, fl_events, _, _, _ = fast_llm_run
    assert code == 0
    last = [e for e in fl_events if e["type"] == "weights_ready"][-1]
    assert last["step"] == STEPS
    report = json.loads(run_cli(["status", str(run_dir), "--json"], timeout=120).stdout)
    assert (report["progress"]["step"], report["progress"]["samples"]) == (STEPS, last["documents_seen"])
    (listed,) = json.loads(run_cli(["runs", str(run_dir.parent), "--json"], timeout=120).stdout)
    assert (listed["step"], listed["max_train_steps"]) == (STEPS, STEPS)
    output = (run_dir.parent / "rlrun.out").read_text()  # no terminal: plain lines
    assert f"[train] step {STEPS}/{STEPS}  samples {last['documents_seen']}" in output, output[-3000:]
