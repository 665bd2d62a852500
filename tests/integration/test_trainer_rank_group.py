"""Two real trainer ranks under rlrun.entrypoints.rank_group, fed through the run's Redis, no vLLM:
every rank heartbeats, the checkpoint holds one optimizer shard per rank with `ok` last, a
SIGKILLed rank fails the group, whose restart resumes from that checkpoint, a SIGTERM stops the
ranks together at a step boundary with a checkpoint there, and the run ends at the requested step
with every group trained once in the final lineage. ~1.5-2.5 min on 2 busy cores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rlrun.run import launch
from rlrun.config import compose
from rlrun.run.built import build
from rlrun.streams import names
from rlrun.streams.codec import encode
from rlrun.trainer import checkpoint

STEPS = 4


def group_message(group_id: str, seed: int) -> dict:
    samples = [{"index": i, "completion_ids": [3 + (seed + i) % 20, 4, 5][: 1 + (seed + i) % 3], "logprobs": [-1.0, -0.9, -1.1][: 1 + (seed + i) % 3],
                "versions": [0, 0, 0][: 1 + (seed + i) % 3], "finish_reason": "stop", "reward": float(i % 2), "advantage": (-1) ** i * 0.5}
               for i in range(4)]  # fmt: skip
    return {"schema_version": 1, "group_id": group_id, "prompt_index": seed, "prompt_ids": [1, 2 + seed % 5], "samples": samples}


@pytest.fixture
def run(server, client, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=1,
                         num_key_value_heads=1, tie_word_embeddings=False, max_position_embeddings=64)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    cfg, resolved = compose([
        "recipe=math_grpo", "algo.group_size=4", "trainer.train_batch_size=4", "trainer.gradient_accumulation_passes=2",
        "trainer.nproc_per_node=2", f"trainer.max_train_steps={STEPS}", "trainer.checkpoint_every=2", "trainer.lr=1e-3",
    ])  # fmt: skip
    run_dir = launch.create_run(build(cfg), resolved, [], root=tmp_path / "run")
    run_dir.write_secret(run_dir.redis_password, server.password)
    return run_dir


def start(run_dir, server, tmp_path) -> subprocess.Popen:
    from rlrun.parts.role_parts import role_command

    argv, write_role_file = role_command(run_dir, "rlrun.entrypoints.trainer", "trainer", redis_url=server.url, model_path=str(tmp_path / "model"))
    write_role_file()  # as the supervisor does before every (re)start
    log = open(tmp_path / "trainer.log", "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", "2", "--", *argv],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def wait_for(predicate, what: str, group: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert group.poll() is None, f"the rank group exited ({group.returncode}) before {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_killed_rank_restarts_the_group_from_its_sharded_checkpoint(run, server, client, tmp_path):
    def push(first: int, count: int) -> None:
        for g in range(first, first + count):
            client.xadd(names.GROUPS_STREAM, {"data": encode(group_message(f"run/{g}", g))})

    def trained() -> list[dict]:  # read while the trainer appends: its last line may be half in
        text = run.trained_groups.read_text() if run.trained_groups.is_file() else ""
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]

    push(0, 6)  # 3 steps of 2 groups: the third is after the checkpoint at step 2
    group = start(run, server, tmp_path)
    try:
        state = lambda: client.hgetall(names.TRAINER_STATE)  # noqa: E731
        wait_for(lambda: any(r["step"] == 3 for r in trained()), "step 3", group)
        assert state().get(names.rank_heartbeat(1)) and state().get("heartbeat")  # both ranks beat
        ranks = sorted(psutil.Process(group.pid).children(), key=lambda p: p.pid)
        titles = [p.cmdline()[0] for p in ranks]
        assert len(ranks) == 2 and sorted(t.split()[0] for t in titles) == ["rlrun:trainer-rank0", "rlrun:trainer-rank1"]
        rank1 = next(p for p, title in zip(ranks, titles) if title.startswith("rlrun:trainer-rank1"))
        rank1.send_signal(signal.SIGKILL)
        assert group.wait(timeout=60) == 128 + signal.SIGKILL  # the group fails with its rank
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks), "a rank was left behind"
        step2 = run.checkpoint(2)
        assert checkpoint.problem(step2) is None
        shards = sorted(p.name for p in (step2 / checkpoint.OPTIMIZER_DIR).iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its shard
        manifest = json.loads((step2 / checkpoint.OK_MARKER).read_text())["files"]
        assert {"optimizer/.metadata", "optimizer/__0_0.distcp", "optimizer/__1_0.distcp"} <= set(manifest)

        group = start(run, server, tmp_path)  # what the supervisor's restart policy does
        wait_for(lambda: sum(r["step"] == 3 for r in trained()) == 2, "step 3 trained again", group)
        # SIGTERM to the group (the supervisor's orderly stop) while rank 0 waits for step 4's
        # groups: the ranks agree to stop and checkpoint step 3 (checkpoint_every=2 would not).
        os.killpg(group.pid, signal.SIGTERM)
        assert group.wait(timeout=60) == 0
        assert checkpoint.latest_complete(run.checkpoints) == run.checkpoint(3)
        assert checkpoint.problem(run.checkpoint(3)) is None

        group = start(run, server, tmp_path)
        wait_for(lambda: client.hget(names.TRAINER_STATE, "ready_pid") == str(group.pid), "the restarted group's ready marker", group)
        push(6, 2)
        assert group.wait(timeout=180) == 0
    finally:
        if group.poll() is None:
            os.killpg(group.pid, signal.SIGKILL)
    log = (tmp_path / "trainer.log").read_text()
    assert "resumed from" in log and "at step 2" in log and "stopped on request at step 3" in log
    assert f"resumed from {run.checkpoint(3)} at step 3" in log
    final = {}
    for record in trained():  # a step trained again after the restart replaces the lost one
        final[record["step"]] = record["groups"]
    assert sorted(final) == list(range(1, STEPS + 1))
    lineage = [g for step in sorted(final) for g in final[step]]
    assert sorted(lineage) == sorted(f"run/{g}" for g in range(8)) and len(set(lineage)) == len(lineage)
    last = checkpoint.latest_complete(run.checkpoints)
    assert last == run.checkpoint(STEPS) and checkpoint.read_state(last).step == STEPS
    assert (last / "model.safetensors").is_file()  # a whole HF copy for vLLM and users
