"""Token-level recovery on the real stack: long generations are interrupted by a SIGKILL of the
vLLM server or of the actor, and every unfinished sample continues from its exact prefix.

The actor's audit trail (actor.audit=true) records every batch of tokens it journaled, with its
offset, and every group it delivered. A regenerated sample would show a batch that does not
start where the previous one ended; a duplicated delivery would show twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrun.trainer.checkpoint import latest_complete, read_state

from .conftest import LONG_GENERATIONS, STEPS, check_exact_continuation, in_flight_tokens, kill_mid_generation, left_behind, start_rlrun, trained_once, wait_for

pytestmark = pytest.mark.e2e


def run_with_kill(tmp_path: Path, victim: str, *extra: str):
    run_dir = tmp_path / "run"
    proc = start_rlrun(run_dir, *LONG_GENERATIONS, *extra)
    try:
        wait_for(lambda: in_flight_tokens(run_dir) > 0, 600, "long generations in flight", proc)
        killed_at = kill_mid_generation(run_dir, victim, proc, tokens=200)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, run_dir, killed_at, left_behind(proc)


def actor_counters(run_dir: Path) -> dict:
    """The counters of the last actor process, from its closing log line."""
    import ast

    def order(log: Path) -> tuple[int, int]:  # logs/launch-<n>/actor.log, then actor.<restart>.log
        restart = log.name.split(".")[1] if log.name.count(".") == 2 else "0"
        return int(log.parent.name.removeprefix("launch-")), int(restart)

    logs = sorted((run_dir / "logs").rglob("actor*.log"), key=order)
    last = [line for line in logs[-1].read_text().splitlines() if "actor stops (" in line][-1]
    return ast.literal_eval(last.split("actor stops (", 1)[1].rstrip(")"))


def test_vllm_sigkill_mid_generation_continues_every_sample_from_its_exact_prefix(tmp_path):
    code, run_dir, killed_at, left = run_with_kill(tmp_path, "vllm-0")
    assert code == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    result = check_exact_continuation(run_dir, killed_at)
    assert result["spanning"] > 0, "no sample was in flight across the kill"
    trained_once(run_dir, result["delivered"])
    state = actor_counters(run_dir)  # kept by the running actor after its requests failed, not from the journal
    assert state["samples_continued_on_retry"] > 0 and state["tokens_kept_on_retry"] > 0, state
    assert left == []


def test_actor_sigkill_mid_generation_replays_the_journal(tmp_path):
    code, run_dir, killed_at, left = run_with_kill(tmp_path, "actor", "actor.journal_flush_tokens=1")
    assert code == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    result = check_exact_continuation(run_dir, killed_at)
    assert result["spanning"] > 0, "no sample was continued by the restarted actor"
    trained_once(run_dir, result["delivered"])
    assert "replaying the journal" in (run_dir / "logs" / "launch-1" / "actor.1.log").read_text()
    state = actor_counters(run_dir)  # the restarted actor's: kept from the journal
    assert state["samples_continued"] > 0 and state["tokens_reused"] > 0, state
    assert left == []
