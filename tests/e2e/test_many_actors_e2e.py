"""Several actors on the real stack (actor.num_actors): two actors, two vLLM servers, one of the
actors SIGKILLed mid-generation. The run completes at exactly the requested step, every group is
trained once, the killed actor's replacement continues its in-flight tokens (reuse ratio as
bench/recovery.py measures it), and the other actor goes on publishing while it is down. Then a
run whose journal is on a three-node valkey cluster (streams.url): its actors' journals land on
different nodes."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from rlrun.streams import names
from rlrun.trainer.checkpoint import latest_complete, read_state
from tests.redis_cluster import local_cluster

from .conftest import LONG_GENERATIONS, STEPS, audit, events, in_flight_tokens, kill_mid_generation, left_behind, read_jsonl, start_rlrun, trained_once, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TWO = ["actor.num_actors=2", "inference.num_servers=2"]


def _recovery_bench():
    spec = importlib.util.spec_from_file_location("bench_recovery", REPO / "bench" / "recovery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_actors_one_killed_the_other_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_rlrun(run_dir, *LONG_GENERATIONS, *TWO, "actor.journal_flush_tokens=1", "supervisor.live_view=false")
    try:
        wait_for(lambda: in_flight_tokens(run_dir, "actor-0") > 0, 600, "actor-0's long generations in flight", proc)
        killed_at = kill_mid_generation(run_dir, "actor-0", proc, actor="actor-0")
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS

    audits = {a: audit(run_dir, a) for a in ("actor-0", "actor-1")}
    delivered = {a: [r["group_id"] for r in records if r["kind"] == "delivered"] for a, records in audits.items()}
    for actor, ids in delivered.items():  # each in its own namespace, none twice
        assert ids and len(ids) == len(set(ids)) and all(g.split("/")[1] == f"a{actor[-1]}" for g in ids), ids
    prompts = {a: [r["prompt_index"] for r in records if r["kind"] == "delivered"] for a, records in audits.items()}
    trained_once(run_dir, set(delivered["actor-0"]) | set(delivered["actor-1"]))

    # the killed actor's in-flight tokens are continued by its replacement
    r = _recovery_bench().reuse(audits["actor-0"], killed_at)
    assert r["streamed"] >= 100 and r["kept"] / r["streamed"] >= 0.99, r
    run_events = events(run_dir)
    restarted = [e for e in run_events if e.get("event") == "process_restarted"]
    assert [e["process"] for e in restarted] == ["actor-0"], restarted  # only the victim
    # its replacement's first record (the victim may still write one between killed_at and the signal)
    victim = [r["pid"] for r in audits["actor-0"] if r["time"] <= killed_at][-1]
    back = next(r["time"] for r in audits["actor-0"] if r["time"] > killed_at and r["pid"] != victim)
    # actor-1 kept generating meanwhile. Tokens, not whole groups: actor-0 is back within ~2 s, often
    # before actor-1's first long group is done.
    generated_meanwhile = [r for r in audits["actor-1"] if r["kind"] == "journaled" and killed_at < r["time"] < back]
    assert generated_meanwhile, f"actor-1 generated nothing in the {back - killed_at:.1f} s actor-0 was down"

    # groups spread over both servers: each actor's requests went to its own one
    for k in (0, 1):
        log = next((run_dir / "logs").rglob(f"vllm-{k}.log")).read_text()
        assert "/inference/v1/generate" in log, f"vllm-{k} served no generation"
    assert prompts["actor-0"] and prompts["actor-1"]
    assert left_behind(proc) == []


def test_a_run_with_its_journal_on_a_three_node_cluster(tmp_path):
    password = "cluster-e2e-secret"
    password_file = tmp_path / "cluster.password"
    password_file.write_text(password + "\n")
    os.chmod(password_file, 0o600)
    with local_cluster(tmp_path / "cluster", password, nodes=3) as cluster:
        run_dir = tmp_path / "run"
        proc = start_rlrun(
            run_dir, "recipe=math_grpo", "trainer.max_train_steps=2", "trainer.train_batch_size=48", "actor.num_actors=3",
            "inference.num_servers=1", f"streams.url={cluster.url}", f"streams.password_file={password_file}",
            "supervisor.live_view=false",
        )  # fmt: skip
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
        assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
        holders = {}
        for k in range(3):
            node = cluster.node(k)
            holders[k] = sorted(node.scan_iter(f"{names.JOURNAL_BASE}*"))
            node.close()
        assert all(holders.values()), f"journal keys per node: {holders}"  # a0, a1, a2: one node each
        for k, keys in holders.items():
            assert {names.hash_tag(key) for key in keys} == {f"a{k}"}, keys
        assert left_behind(proc) == []
