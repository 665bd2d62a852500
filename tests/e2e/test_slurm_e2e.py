"""world=slurm on a real SLURM (Debian's slurm-wlm 22.05 and munge, started by the test) and the real
stack. Two nodes, each in a network namespace of its own (tests/slurm_cluster.py), where this
machine allows namespaces (one node on 127.0.0.1 otherwise, said in the session's summary): node0
(1 CPU) runs the batch step (rlrun, Redis) and trainer rank 0; node1 (3 CPUs) vLLM, the actor
beside it and trainer rank 1, so the servers listen on their node's address and the trainer's
ranks meet across nodes. One run, three starts, serves every test here:

1. `rlrun submit` → job A; mid-run, `scancel A`: every process stops in order (the trainer
   checkpoints at its step boundary), nothing of the job is left, `rlrun status` says cancelled.
2. `rlrun resume RUN` → job B, which continues the run; mid-run its time limit is brought near
   (`scontrol update TimeLimit`), so SLURM sends the --signal=B:USR1 the batch script asked for: the
   trainer checkpoints at its step boundary, everything stops in order and B requeues itself.
3. The requeued B (SLURM's restart 1) continues from that checkpoint and ends at exactly
   max_train_steps; every group is trained once in the final lineage, every journaled token ends
   up where it was (the audit of test_recovery.py), and no process of any start is left.

SLURM holds a requeued job for ~2 minutes before it may start again; the test lets it start at
once (`scontrol update StartTime=now+2`). Skipped, with the reason in the session's summary, where
SLURM cannot be started (not installed, not root): ./scripts/setup-env installs it as root.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlrun.trainer.checkpoint import latest_complete, read_state
from tests.slurm_cluster import JobProcesses, LocalSlurm, NamespacesUnavailable, available

from .conftest import check_exact_continuation, events, read_jsonl, steps_done, summary, trained_once, wait_for

pytestmark = pytest.mark.e2e

STEPS = 100  # the time-limit signal comes up to 30 s after it is due: at ~0.75 s a step, ~40 steps later; it must find the run mid-way
LEAD_S = 150  # --signal=B:USR1@150: with the limit brought to <= 150 s away, SLURM signals at its next check
CONFIG = [
    "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.checkpoint_every=1000",
    "actor.max_new_tokens=48", "actor.min_new_tokens=40", "actor.audit=true", "actor.max_prefix_staleness=1000",
    "actor.max_concurrent_groups=8", "supervisor.stop_grace_s=10", "world=slurm", "world.time=30", f"world.signal_lead_s={LEAD_S}",
]  # fmt: skip
# vLLM (1 CPU) and its actor (1) do not fit node0 (1): node1; trainer rank 0 takes node0's CPU, rank 1 node1's.
TWO_NODES = ([("node0", 1), ("node1", 3)], ["world.nodes=2", "trainer.nproc_per_node=2", "trainer.train_batch_size=32", "trainer.gradient_accumulation_passes=2"])
ONE_NODE = ([("node0", 2)], ["trainer.train_batch_size=64", "world.actor.cpus=0"])  # 2 CPUs: vLLM's, the trainer's
ACTIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")

REASON = available()
if REASON:
    summary("SLURM end-to-end tests skipped", [REASON])


def rlrun(slurm: LocalSlurm, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlrun", *args], capture_output=True, text=True, env=slurm.env, timeout=300)


def status(run_dir: Path) -> str:
    return json.loads((run_dir / "state.json").read_text()).get("status", "")


def job_of(run_dir: Path) -> str:
    return json.loads((run_dir / "state.json").read_text())["slurm_job_id"]


def stopped(run_dir: Path, job: str) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "slurm_job_stopped" and e["job"] == job]


def seconds(clock: str) -> int:
    """scontrol's RunTime ([D-]HH:MM:SS) in seconds."""
    days, _, rest = clock.rpartition("-")
    h, m, s = (int(x) for x in rest.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory):
    if REASON:
        pytest.skip(REASON)
    root = tmp_path_factory.mktemp("slurm")
    run_dir = root / "run"
    facts: dict = {"timing": {}}
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            nodes, config = TWO_NODES
            slurm = stack.enter_context(LocalSlurm(root / "cluster", nodes=nodes))
        except NamespacesUnavailable as exc:
            nodes, config = ONE_NODE
            slurm = stack.enter_context(LocalSlurm(root / "cluster-1", nodes=nodes))
            summary("SLURM end-to-end run on one node", [f"no network namespaces here ({exc}): one node on 127.0.0.1"])
        facts["nodes"] = [name for name, _ in nodes]
        jobs = JobProcesses(slurm)
        try:
            # 1. submit; scancel mid-run
            submitted = rlrun(slurm, "submit", f"run.dir={run_dir}", *CONFIG, *config)
            facts["submit"] = submitted
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr
            job_a = job_of(run_dir)
            wait_for(lambda: steps_done(run_dir) >= 2, 600, "step 2 of job A")
            facts["cancelled_at_step"] = steps_done(run_dir)
            slurm.run("scancel", job_a)
            wait_for(lambda: slurm.job_state(job_a) not in ACTIVE, 120, "job A to end after scancel")
            facts["timing"]["A"] = time.monotonic() - began
            facts["after_cancel"] = {
                "status": status(run_dir), "cli": rlrun(slurm, "status", str(run_dir)).stdout, "stopped": stopped(run_dir, job_a),
                "checkpoint": read_state(latest_complete(run_dir / "checkpoints")).step, "left": jobs.alive(grace_s=10),
                "seen": len(jobs.seen),
            }  # fmt: skip

            # 2. `rlrun resume` submits it again; its time limit brought near mid-run
            mark = time.monotonic()
            resumed = rlrun(slurm, "resume", str(run_dir))
            facts["resume"] = resumed
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            job_b = job_of(run_dir)
            facts["jobs"] = (job_a, job_b)
            checkpoint = facts["after_cancel"]["checkpoint"]
            wait_for(lambda: steps_done(run_dir) >= checkpoint + 2 and status(run_dir) == "running", 600, "job B to train 2 steps")
            # A limit at most LEAD_S away: SLURM signals at its next time-limit check (every 30 s).
            limit = math.floor((seconds(slurm.job_field(job_b, "RunTime")) + LEAD_S) / 60)
            slurm.run("scontrol", "update", f"JobId={job_b}", f"TimeLimit={limit}")
            facts["limited_at_step"] = steps_done(run_dir)
            wait_for(lambda: status(run_dir) == "requeued", 120, "job B to stop at the time-limit signal and requeue itself")
            facts["requeued"] = {"stopped": stopped(run_dir, job_b), "checkpoint": read_state(latest_complete(run_dir / "checkpoints")).step,
                                 "steps": steps_done(run_dir)}  # fmt: skip
            wait_for(lambda: slurm.job_state(job_b) == "PENDING", 120, "the requeued job B to be pending")
            facts["timing"]["B"] = time.monotonic() - mark

            # 3. the requeued job continues to the end
            mark = time.monotonic()
            # The job's limit back to world.time (a requeued job keeps the limit of its last start: the
            # one brought near would signal the new start again before it had trained a step) and no
            # 2-minute hold in a test. Not `now`: slurmd revokes the requeued start's credential to the
            # second, and a start in that same second is refused ("Job credential revoked").
            slurm.run("scontrol", "update", f"JobId={job_b}", "TimeLimit=30", "StartTime=now+2")
            wait_for(lambda: slurm.job_state(job_b) not in ACTIVE, 900, "the requeued job B to finish")
            facts["timing"]["B requeued"] = time.monotonic() - mark
            facts["restarts"] = slurm.job_field(job_b, "Restarts")
            facts["final_cli"] = rlrun(slurm, "status", str(run_dir), "--json").stdout
            facts["left"] = jobs.alive(grace_s=10)
            facts["seen"] = len(jobs.seen)
            facts["cmdlines"] = sorted(jobs.cmdlines)
            facts["placed"] = sorted(jobs.placed, key=str)
            facts["addresses"] = dict(slurm.addresses)
        finally:
            jobs.stop()
            facts["output"] = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((run_dir / "slurm").glob("job-*.out")))
    facts["timing"]["total"] = time.monotonic() - began
    summary(f"SLURM end-to-end run on {len(facts['nodes'])} node(s) (seconds)", [f"{k}: {v:.0f}" for k, v in facts["timing"].items()])
    return run_dir, facts


def test_scancel_stops_everything_in_order_and_the_run_reads_cancelled(slurm_run):
    run_dir, facts = slurm_run
    after = facts["after_cancel"]
    assert after["status"] == "cancelled", facts["output"]
    assert "cancelled" in after["cli"]
    assert [(e["signal"], e["reason"], e["action"]) for e in after["stopped"]] == [("TERM", "", "stop")]
    assert after["checkpoint"] >= facts["cancelled_at_step"]  # checkpointed at a step boundary (checkpoint_every=1000)
    assert after["seen"] >= 6 and after["left"] == []  # batch step, srun steps, vLLM, trainer, actor, Redis: all gone


def test_resume_submits_the_run_again_and_the_time_limit_signal_requeues_it(slurm_run):
    run_dir, facts = slurm_run
    job_a, job_b = facts["jobs"]
    assert job_b != job_a and f"submitted SLURM job {job_b}" in facts["resume"].stdout
    requeued = facts["requeued"]
    assert [(e["signal"], e["action"]) for e in requeued["stopped"]] == [("USR1", "requeue")]
    assert requeued["stopped"][0]["checkpoint_step"] == requeued["checkpoint"] >= facts["limited_at_step"]  # its step boundary
    assert requeued["checkpoint"] < STEPS  # mid-run
    starts = [(e["job"], e["restart"]) for e in events(run_dir) if e["event"] == "slurm_job_started"]
    assert starts == [(job_a, 0), (job_b, 0), (job_b, 1)]
    assert facts["restarts"] == "1"


def test_the_requeued_job_ends_at_exactly_max_train_steps_with_every_group_trained_once(slurm_run):
    run_dir, facts = slurm_run
    assert json.loads(facts["final_cli"])["status"] == "finished", facts["output"]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    assert sorted({m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")}) == list(range(1, STEPS + 1))
    result = check_exact_continuation(run_dir, killed_at=0.0)
    trained_once(run_dir, result["delivered"], steps=STEPS)
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["launch-1", "launch-2", "launch-3"]


def test_every_process_was_a_step_of_the_job_and_none_is_left(slurm_run):
    _, facts = slurm_run
    assert facts["left"] == []
    shown = "\n".join(facts["cmdlines"])
    for marker in ("rlrun resume", "rlrun.entrypoints.slurm_step", "vllm.entrypoints.openai.api_server", "rlrun.entrypoints.trainer", "rlrun.entrypoints.actor"):
        assert marker in shown, marker


def test_on_two_nodes_each_process_runs_where_the_plan_puts_it_and_servers_listen_there(slurm_run):
    run_dir, facts = slurm_run
    if len(facts["nodes"]) < 2:
        pytest.skip("one node here: this machine cannot make network namespaces (tests/slurm_cluster.py)")
    placed = facts["placed"]

    def nodes_of(marker: str) -> set:
        return {node for cmdline, node in placed if cmdline.startswith(marker)}

    assert nodes_of("rlrun:trainer-rank0") == {"node0"} and nodes_of("rlrun:trainer-rank1") == {"node1"}  # ranks meet across nodes
    assert nodes_of("rlrun:actor") == {"node1"}  # beside its vLLM server
    # (the batch node's srun of each step names the step's command too: the process itself is what counts)
    assert {node for cmdline, node in placed if cmdline.split()[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]} == {"node1"}
    assert {node for cmdline, node in placed if "rlrun resume" in cmdline} == {"node0"}  # the batch step: rlrun, and Redis beside it
    assert {node for cmdline, node in placed if "redis.conf" in cmdline} == {"node0"}
    actor_role = (run_dir / "roles" / "actor.yaml").read_text()
    assert f"http://{facts['addresses']['node1']}:" in actor_role  # vLLM's URL names its node's address
    assert f"redis://{facts['addresses']['node0']}:" in actor_role  # and Redis's the batch node's
