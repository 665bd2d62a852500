"""The trainer as 2 data-parallel ranks on the real stack, with 2 vLLM servers that get the weights
by broadcast from rank 0 (trainer.weight_transfer=broadcast; every other e2e run uses the disk
path, the default): one rank is
SIGKILLed after the checkpoint at step 2; the whole rank group fails and is restarted from that
checkpoint, and the run ends at exactly the requested step, every trained group trained once in
the final lineage (the audit of test_recovery.py), nothing left running. The clean run's
properties (exact step, exit 0, no process left) are asserted on the same run: one e2e, not two.
~115-175 s on 2 busy cores (6 steps of 128 samples, tiny model; the same with the disk path).
"""

from __future__ import annotations

import re
import signal

import psutil
import pytest
import yaml

from rlrun.trainer.checkpoint import OPTIMIZER_DIR, latest_complete, read_state

from tests.processes import listening_sockets, off_loopback

from .conftest import left_behind, read_jsonl, restarts, start_rlrun, steps_done, summary, wait_for

pytestmark = pytest.mark.e2e

STEPS = 6

RANKS = [
    "recipe=math_gspo", f"trainer.max_train_steps={STEPS}", "trainer.nproc_per_node=2", "trainer.train_batch_size=64",
    "trainer.gradient_accumulation_passes=2", "trainer.checkpoint_every=2", "inference.num_servers=2",
    "actor.audit=true", "supervisor.stop_grace_s=5", "trainer.weight_transfer=broadcast",
    "trainer.overlap_weight_update=true",
]  # fmt: skip


def rank_process(run_dir, rank: int) -> psutil.Process:
    """The trainer rank `rank` of the current attempt (its title is rlrun:trainer-rank<r>)."""
    started = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] in ("process_started", "process_restarted") and e["process"] == "trainer"]
    for proc in psutil.Process(started[-1]["pid"]).children(recursive=True):
        if proc.cmdline()[:1] and proc.cmdline()[0].startswith(f"rlrun:trainer-rank{rank}"):
            return proc
    raise AssertionError(f"no trainer rank {rank} under the trainer's group")


def test_two_ranks_two_servers_a_killed_rank_restarts_the_group_and_the_run_ends_at_its_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_rlrun(run_dir, *RANKS)
    try:
        wait_for(lambda: steps_done(run_dir) >= 3, 900, "step 3 (after the checkpoint at step 2)", proc)
        # Rank 0 serves the broadcast's store from the first update (step 1's) to its end: looked
        # at now, not only by the sampler (every 2 s), which can miss a group that lives ~2 s.
        rank0_listening = listening_sockets([rank_process(run_dir, 0).pid])
        rank_process(run_dir, 1).send_signal(signal.SIGKILL)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (tmp_path / "rlrun.out").read_text()[-3000:]
    assert left_behind(proc) == []
    # Every socket the run listened on, the broadcast's TCPStore (torch's own listens on ::) and
    # the ranks' store and gloo pairs included, was on loopback.
    listening = {**proc.run_processes.listening, **rank0_listening}
    store = yaml.safe_load((run_dir / "roles" / "trainer.yaml").read_text())["broadcast_port"]
    assert ("127.0.0.1", store) in listening and "rlrun:trainer" in listening[("127.0.0.1", store)], listening
    assert off_loopback(listening) == {}, listening
    summary("sockets a broadcast run listened on (address:port  pid command)",
            [f"{ip}:{port}  {who}" for (ip, port), who in sorted(listening.items())])
    assert restarts(run_dir, "trainer") == 1  # the group, once
    last = latest_complete(run_dir / "checkpoints")
    assert read_state(last).step == STEPS and (last / OPTIMIZER_DIR / "__1_0.distcp").is_file()
    final = {}
    for line in read_jsonl(run_dir / "trained_groups.jsonl"):
        final[line["step"]] = line["groups"]  # a step retrained after the restart replaces the lost one
    trained = [g for groups in final.values() for g in groups]
    assert sorted(final) == list(range(1, STEPS + 1))
    assert len(trained) == len(set(trained)), "a group was trained twice"
    delivered = {r["group_id"] for r in read_jsonl(run_dir / "audit" / "actor.jsonl") if r["kind"] == "delivered"}
    assert set(trained) <= delivered
    log = next((run_dir / "logs").rglob("trainer.1.log")).read_text()
    # The kill lands after step 3, by when the checkpoint of step 2 or, steps being quick, of step 4
    # was written: the group resumes from it.
    resumed = re.search(r"resumed from \S+ at step (\d+)", log)
    assert resumed and int(resumed[1]) in (2, 4), log
    # The restarted group formed its own broadcast group with both servers and broadcast every
    # version from its checkpoint's on; files were written at checkpoints only (steps 2, 4, 6).
    assert "forming the weight broadcast group" in log and f"weights v{STEPS} broadcast" in log
    assert all(f"weights v{v} broadcast" in log for v in range(int(resumed[1]), STEPS + 1)), log
    assert {p.name for p in (run_dir / "weights").glob("v*")} <= {f"v{v:06d}" for v in (2, 4, 6)}
    assert (run_dir / "weights" / "current").resolve().name == f"v{STEPS:06d}"
    served = [r["behaviour_version_max"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert max(served) >= STEPS - 2, served  # vLLM sampled with broadcast weights (versions the actor saw)
