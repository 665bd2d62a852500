"""Token-level recovery on the real stack: long generations are interrupted by a SIGKILL of the
vLLM server or of the actor, and every unfinished sample continues from its exact prefix.

The actor's audit trail (actor.audit=true) records every batch of tokens it journaled, with its
offset, and every group it delivered. A regenerated sample would show a batch that does not
start where the previous one ended; a duplicated delivery would show twice.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from rlrun.trainer.checkpoint import latest_complete, read_state

from .conftest import left_behind, read_jsonl, start_rlrun
from .test_failures import current_pid, wait_for

pytestmark = pytest.mark.e2e

STEPS = 5
BUDGET = 48

LONG_GENERATIONS = [
    "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.train_batch_size=64", "trainer.checkpoint_every=100",
    f"actor.max_new_tokens={BUDGET}", "actor.min_new_tokens=40", "actor.audit=true", "actor.max_prefix_staleness=1000",
    "actor.max_concurrent_groups=8", "supervisor.stop_grace_s=5",
]  # fmt: skip


def audit(run_dir: Path) -> list[dict]:
    path = run_dir / "audit" / "actor.jsonl"
    return read_jsonl(path) if path.is_file() else []


def in_flight_tokens(run_dir: Path) -> int:
    """Tokens journaled for groups not delivered yet."""
    records = audit(run_dir)
    delivered = {r["group_id"] for r in records if r["kind"] == "delivered"}
    return sum(len(r["token_ids"]) for r in records if r["kind"] == "journaled" and r["group"] not in delivered)


def run_with_kill(tmp_path: Path, victim: str, *extra: str):
    run_dir = tmp_path / "run"
    proc = start_rlrun(run_dir, *LONG_GENERATIONS, *extra)
    try:
        wait_for(lambda: in_flight_tokens(run_dir) >= 200, 600, "long generations in flight", proc)
        killed_at = time.time()
        os.kill(current_pid(run_dir, victim), signal.SIGKILL)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, run_dir, killed_at, left_behind(proc)


def actor_counters(run_dir: Path) -> dict:
    """The counters of the last actor process, from its closing log line."""
    import ast

    logs = sorted((run_dir / "logs").rglob("actor*.log"))
    last = [line for line in logs[-1].read_text().splitlines() if "actor stops (" in line][-1]
    return ast.literal_eval(last.split("actor stops (", 1)[1].rstrip(")"))


def check_exact_continuation(run_dir: Path, killed_at: float) -> dict:
    """Every token journaled before or after the kill is exactly where it ended up for training.

    Each audited batch must equal the delivered sample at its offset (tokens and log-probs): a
    regenerated prefix would differ there. The batches must cover the sample, except for at most
    one batch per sample whose audit line was lost when its writer was SIGKILLed after the
    journal append (the journal, not the audit, is the source of truth).
    """
    records = audit(run_dir)
    batches = defaultdict(list)
    for r in records:
        if r["kind"] == "journaled":
            batches[(r["group"], r["index"])].append(r)
    delivered = [r for r in records if r["kind"] == "delivered"]
    ids = [g["group_id"] for g in delivered]
    assert len(ids) == len(set(ids)), "a group was delivered twice"
    spanning = 0
    for group in delivered:
        for sample in group["samples"]:
            name = f"{group['group_id']}/{sample['index']}"
            tokens, logprobs = sample["completion_ids"], sample["logprobs"]
            assert len(tokens) <= BUDGET  # the budget holds across continuations
            chain = batches[(group["group_id"], sample["index"])]
            covered = set()
            for batch in chain:
                end = batch["offset"] + len(batch["token_ids"])
                assert tokens[batch["offset"] : end] == batch["token_ids"], f"{name}: tokens at {batch['offset']} were regenerated"
                assert logprobs[batch["offset"] : end] == batch["logprobs"], f"{name}: log-probs at {batch['offset']} changed"
                covered.update(range(batch["offset"], end))
            holes = sorted(set(range(len(tokens))) - covered)
            assert not holes or holes == list(range(holes[0], holes[-1] + 1)), f"{name}: scattered gaps {holes}"
            if chain and chain[0]["time"] < killed_at < chain[-1]["time"]:
                spanning += 1
    return {"delivered": set(ids), "spanning": spanning}


def trained_once(run_dir: Path, delivered: set[str]) -> None:
    final_steps = {}
    for line in read_jsonl(run_dir / "trained_groups.jsonl"):
        final_steps[line["step"]] = line["groups"]  # a step retrained after a restart replaces the first
    trained = [g for groups in final_steps.values() for g in groups]
    assert sorted(final_steps) == list(range(1, STEPS + 1))
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert set(trained) <= delivered


def test_vllm_sigkill_mid_generation_continues_every_sample_from_its_exact_prefix(tmp_path):
    code, run_dir, killed_at, left = run_with_kill(tmp_path, "vllm-0")
    assert code == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    result = check_exact_continuation(run_dir, killed_at)
    assert result["spanning"] > 0, "no sample was in flight across the kill"
    trained_once(run_dir, result["delivered"])
    state = actor_counters(run_dir)
    assert state["samples_continued"] > 0 and state["tokens_reused"] > 0, state
    assert left == []


def test_actor_sigkill_mid_generation_replays_the_journal(tmp_path):
    code, run_dir, killed_at, left = run_with_kill(tmp_path, "actor", "actor.journal_flush_tokens=1")
    assert code == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    result = check_exact_continuation(run_dir, killed_at)
    assert result["spanning"] > 0, "no sample was continued by the restarted actor"
    trained_once(run_dir, result["delivered"])
    assert "replaying the journal" in (run_dir / "logs" / "launch-1" / "actor.1.log").read_text()
    assert left == []
