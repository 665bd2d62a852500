"""Rollouts of several turns on the real stack (tiny model, vLLM CPU, Redis, trainer), with a
tool that counts its calls (tests/envs/counting_tool.py), and the actor SIGKILLed while
conversations wait on a step behind a finished tool call: the run ends at the exact step, every
conversation is trained once, no step whose answer the journal held runs again, the tokens the
journal held are reused, and every request's prompt was the conversation's ids as sent and sampled.
Held-out conversations are evaluated with the same environment.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from rlrun.telemetry.metrics import eval_records
from rlrun.trainer.checkpoint import latest_complete, read_state

from .conftest import audit, current_pid, left_behind, read_jsonl, start_rlrun, trained_once, wait_for
from .test_recovery import actor_counters

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
RUN = [
    "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.train_batch_size=32", "trainer.checkpoint_every=100",
    f"environment.step={ROOT / 'tests/envs/counting_tool.py'}:step", "environment.max_total_tokens=40", "environment.workers=4",
    "actor.audit=true", "actor.max_concurrent_groups=4", "supervisor.stop_grace_s=5",
    "dataset.eval_fraction=0.1", "eval.every_steps=2",  # held-out conversations, with the same tool
]  # fmt: skip


def waiting_behind_a_tool_call(records: list[dict]) -> int:
    """Conversations of undelivered groups with a tool's answer journaled and no last step yet."""
    delivered = {r["group_id"] for r in records if r["kind"] == "delivered"}
    answered, ended = set(), set()
    for r in records:
        if r["kind"] == "observed" and r["group"] not in delivered:
            (ended if r.get("done") else answered).add((r["group"], r["index"]))
    return len(answered - ended)


def kill_behind_a_tool_call(run_dir: Path, proc, timeout: float = 300) -> float:
    """SIGKILL the actor, frozen first so that what the audit shows is what the journal holds."""
    pid = current_pid(run_dir, "actor")
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "rlrun exited before the actor could be killed"
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.2)
        if waiting_behind_a_tool_call(audit(run_dir)) >= 2:
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            return killed_at
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.2)
    raise AssertionError("no conversation waited behind a finished tool call")


def test_actor_sigkill_mid_conversation_runs_no_finished_step_again(tmp_path):
    run_dir, tool_log = tmp_path / "run", tmp_path / "tool.log"
    proc = start_rlrun(run_dir, *RUN, env={"RLRUN_TOOL_LOG": str(tool_log), "RLRUN_TOOL_SLEEP": "0.5"})
    try:
        wait_for(lambda: waiting_behind_a_tool_call(audit(run_dir)) > 0, 600, "a conversation behind a tool call", proc)
        killed_at = kill_behind_a_tool_call(run_dir, proc)
        before = [r for r in audit(run_dir) if r["time"] <= killed_at]
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    records = audit(run_dir)
    delivered = [r for r in records if r["kind"] == "delivered"]
    ids = [g["group_id"] for g in delivered]
    assert len(ids) == len(set(ids)), "a conversation's group was delivered twice"
    trained_once(run_dir, set(ids), steps=STEPS)

    # No step whose answer the journal held before the kill ran again; a step run twice was cut.
    starts = Counter(tuple(line.split()[1:]) for line in tool_log.read_text().splitlines() if line.startswith("start"))
    journaled = {(r["group"], str(r["index"]), str(r["turn"])) for r in before if r["kind"] == "observed"}
    assert journaled and all(starts[key] == 1 for key in journaled), [k for k in journaled if starts[k] != 1]
    state = actor_counters(run_dir)  # the restarted actor's
    twice = [key for key, n in starts.items() if n > 1 and not key[0].startswith("eval-")]  # (an evaluation cut is redone)
    assert len(twice) <= state["env_steps_rerun"], (twice, state)
    # Delivered before the kill: audited so, or trained and not delivered after it (the frozen actor
    # may have delivered a group without writing its audit line yet).
    delivered_after = {r["group_id"] for r in records if r["kind"] == "delivered" and r["time"] > killed_at}
    trained = {g for line in read_jsonl(run_dir / "trained_groups.jsonl") for g in line["groups"]}
    delivered_at_kill = {r["group_id"] for r in before if r["kind"] == "delivered"} | (trained - delivered_after)
    assert 0 < len({k for k in journaled if k[0] not in delivered_at_kill}) <= state["env_steps_reused"], state

    # The tokens the journal held for open conversations were reused, not generated again.
    held = Counter()
    for r in before:
        if r["kind"] in ("journaled", "observed") and r["group"] not in delivered_at_kill:
            held[(r["group"], r["index"])] = max(held[(r["group"], r["index"])], r.get("offset", r.get("start", 0)) + len(r["token_ids"]))
    assert sum(held.values()) > 0 and state["tokens_reused"] >= 0.99 * sum(held.values()), (state, sum(held.values()))
    assert "replaying the journal" in (run_dir / "logs" / "launch-1" / "actor.1.log").read_text()

    # Turn by turn, the trainer got the ids the model sampled and the observations' ids, in order:
    # every turn's request was sent exactly the conversation's ids before it.
    sent = {}
    for r in records:
        if r["kind"] == "request" and len(r["indexes"]) == 1:
            sent.setdefault((r["group"], r["indexes"][0]), set()).add(r["prefix"])
    for group in delivered:
        for sample in group["samples"]:
            spans = sample["observation_spans"]
            assert spans, "a conversation without a tool call"
            assert {end for _, end in spans} <= sent.get((group["group_id"], sample["index"]), set())
            for start, end in spans:
                assert sample["logprobs"][start:end] == [0.0] * (end - start)
    # The held-out conversations were evaluated at versions 0, 2 and 4, each with the tool.
    evaluations = eval_records(run_dir / "metrics.jsonl")
    assert [r["policy_version"] for r in evaluations] == [0, 2, 4] and all("abandoned" not in r for r in evaluations), evaluations
    assert all(r["prompts"] == 10 and 0.0 <= r["reward_mean"] <= 1.0 for r in evaluations)
    assert {key[0].split("/")[0] for key in starts if key[0].startswith("eval-")} == {"eval-v0", "eval-v2", "eval-v4"}
    assert left_behind(proc) == []
