"""world=slurm without SLURM: the plan (nodes, ranks, GPUs and srun step of each process), the
config it is made from, the batch script `rlrun submit` writes, and the job's rules (its time
limit, why SLURM stopped it, requeue or not)."""

from __future__ import annotations

import json
import sys

import pytest

from rlrun.cluster import slurm_job, slurm_plan, slurm_step
from rlrun.config import compose
from rlrun.run.built import build
from rlrun.errors import EnvironmentProblem, RestartsExhausted
from rlrun.run.launch import plan_endpoints
from rlrun.run.roles import build_specs
from rlrun.rundir import RunDir, read_jsonl
from rlrun.supervisor import EventLog
from tests.refusals import settings_refusal

SLURM = ["world=slurm"]
# 4 nodes of 8 GPUs: vLLM (tensor-parallel 8) on 2 nodes, the hf trainer's 16 ranks on the 2 others.
BIG = [
    *SLURM, "world.nodes=4", "world.gpus_per_node=8", "inference.num_servers=2", "world.vllm.gpus=8",
    "inference.tensor_parallel_size=8", "trainer.nproc_per_node=16", "world.trainer.gpus=1",
    "trainer.gradient_accumulation_passes=16", "trainer.device=cuda",
]  # fmt: skip
NODES = [slurm_plan.Node(f"gpu-a{k:02d}", f"10.1.0.{k}", 96, 8) for k in range(1, 5)]


def test_the_plan_of_4_nodes_of_8_gpus_puts_vllm_on_two_and_16_trainer_ranks_on_the_others(tmp_path):
    cfg, _ = compose(BIG)
    plan = build(cfg).world.slurm_plan(NODES)

    assert list(plan.placed) == ["redis", "vllm-0", "vllm-1", "trainer", "actor"]  # start order
    assert plan.placed["redis"].local and plan.batch_node.name == "gpu-a01"  # beside the supervisor
    assert [(s.node, s.gpus) for s in plan.placed["vllm-0"].shares] == [("gpu-a01", tuple(range(8)))]
    assert [(s.node, s.gpus) for s in plan.placed["vllm-1"].shares] == [("gpu-a02", tuple(range(8)))]
    trainer = plan.placed["trainer"].shares
    assert [(s.node, s.node_rank, s.first_rank, s.nproc, s.gpus) for s in trainer] == [
        ("gpu-a03", 0, 0, 8, tuple(range(8))),  # ranks 0-7, the rendezvous
        ("gpu-a04", 1, 8, 8, tuple(range(8))),  # ranks 8-15
    ]
    actor = plan.placed["actor"]
    assert actor.nodes == ["gpu-a01"] and actor.anchor == "vllm-0" and actor.shares[0].gpus == ()

    # Spanning nodes, every server listens on its node's address, which its URL names.
    hosts = slurm_plan.server_hosts(plan)
    assert hosts == {"redis": "10.1.0.1", "vllm-0": "10.1.0.1", "vllm-1": "10.1.0.2", "trainer": "10.1.0.3"}
    endpoints = plan_endpoints(build(cfg), lambda host: 7000, hosts)
    assert endpoints.redis_url == "redis://10.1.0.1:7000/0" and endpoints.vllm_urls == ["http://10.1.0.1:7000", "http://10.1.0.2:7000"]
    run = RunDir(tmp_path / "run")
    specs = {spec.name: spec for spec in build_specs(build(cfg), run, endpoints, "/models/m", EventLog(None))}
    assert specs["vllm-1"].argv[specs["vllm-1"].argv.index("--host") + 1] == "10.1.0.2"
    record = tmp_path / "trainer.json"
    log = tmp_path / "trainer.log"
    srun = slurm_plan.srun_argv(plan, "trainer", specs["trainer"].argv, job_id="4242", record=record, log=log, python="/venv/bin/python")
    wrapper = srun.index("/venv/bin/python")
    assert srun[:wrapper] == [
        "srun", "--jobid=4242", "--job-name=trainer", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--nodelist=gpu-a03,gpu-a04", "--kill-on-bad-exit=1", "--export=ALL", "--input=none", f"--output={log}", "--open-mode=append",
    ]  # fmt: skip
    assert srun[wrapper + 1 : wrapper + 5] == ["-m", "rlrun.entrypoints.slurm_step", "--record", str(record)]
    layout = json.loads(srun[srun.index("--layout") + 1])
    assert layout["master_addr"] == "10.1.0.3" and layout["world_size"] == 16  # rank 0's node is the rendezvous
    assert srun[srun.index("--") + 1 :] == specs["trainer"].argv  # the spec's own command, rewritten per node on the node
    second = slurm_step.for_node(layout, "gpu-a04", specs["trainer"].argv, port=29511)
    options = second[second.index("rlrun.entrypoints.rank_group") + 1 : second.index("--")]
    assert dict(zip(options[::2], options[1::2])) == {
        "--nproc": "8", "--nnodes": "2", "--node-rank": "1", "--first-rank": "8", "--world-size": "16",
        "--master-addr": "10.1.0.3", "--master-port": "29511",
    }  # fmt: skip

    vllm = slurm_plan.srun_argv(plan, "vllm-1", specs["vllm-1"].argv, job_id="4242", record=record, log=log)
    assert "--nodelist=gpu-a02" in vllm and vllm[vllm.index("--gpus") + 1] == "0,1,2,3,4,5,6,7" and "--layout" not in vllm
    command = vllm[vllm.index("--") :]
    assert command[command.index("--tensor-parallel-size") + 1] == "8"
    assert "--nodelist=gpu-a01" in slurm_plan.srun_argv(plan, "actor", specs["actor"].argv, job_id="4242", record=record, log=log)
    with pytest.raises(ValueError):
        slurm_plan.srun_argv(plan, "redis", specs["redis"].argv, job_id="4242", record=record, log=log)


def test_gpus_are_divided_between_the_processes_of_one_node():
    cfg, _ = compose([*SLURM, "world.gpus_per_node=4", "world.vllm.gpus=1", "trainer.nproc_per_node=2", "world.trainer.gpus=1",
                      "inference.num_servers=2", "actor.num_actors=2", "trainer.gradient_accumulation_passes=2"])  # fmt: skip
    plan = build(cfg).world.slurm_plan([slurm_plan.Node("n1", "n1", 8, 4)])
    gpus = {name: [s.gpus for s in p.shares] for name, p in plan.placed.items()}
    assert gpus == {"redis": [], "vllm-0": [(0,)], "vllm-1": [(1,)], "trainer": [(2, 3)], "actor-0": [()], "actor-1": [()]}
    assert not plan.spans_nodes()
    assert plan.placed["actor-1"].anchor == "vllm-1"


def test_a_run_that_does_not_fit_names_what_and_what_is_left():
    cfg, _ = compose(BIG)
    with pytest.raises(slurm_plan.DoesNotFit) as info:
        build(cfg).world.slurm_plan(NODES[:3])  # 3 nodes: the trainer's ranks 8-15 find no GPU
    assert "trainer rank 8 needs CPU 1, GPU 1 on one node" in str(info.value)
    assert "gpu-a03: CPU 88, GPU 0" in str(info.value)
    cfg, _ = compose([*SLURM, "world.vllm.cpus=2", "world.actor.cpus=2"])
    with pytest.raises(slurm_plan.DoesNotFit, match="vllm-0 needs CPU 4 on one node .with actor, which runs beside it."):
        build(cfg).world.slurm_plan([slurm_plan.Node("n1", "n1", 2, 0)])


def test_dry_run_shows_where_each_process_goes_and_its_srun_step(capsys):
    from typer.testing import CliRunner

    from rlrun.cli.app import app

    result = CliRunner().invoke(app, ["submit", "--dry-run", *BIG, "run.dir=/tmp/rlrun-dry-run-slurm"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --nodes=4" in result.output and "#SBATCH --gpus-per-node=8" in result.output
    assert "trainer: srun --jobid=$SLURM_JOB_ID --job-name=trainer --overlap --nodes=2" in result.output
    assert "--nodelist=node2,node3" in result.output  # node0.. until SLURM names them


def test_slurm_commands_outside_a_job_say_what_to_run(monkeypatch):
    from typer.testing import CliRunner

    from rlrun.cli.app import app

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = CliRunner().invoke(app, ["train", *SLURM, "run.dir=/tmp/rlrun-never-created"])
    assert result.exit_code == 3 and "rlrun submit" in result.output
    result = CliRunner().invoke(app, ["submit", "run.dir=/tmp/rlrun-never-created"])
    assert result.exit_code == 2 and "add world=slurm" in result.output


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([*SLURM, "world.time=soon"], "world.time='soon' is not a SLURM time limit"),
        ([*SLURM, "world.time=10", "world.signal_lead_s=600"], "world.signal_lead_s=600 is not shorter than world.time=10"),
        ([*SLURM, "+world.vllm.resources={vllm_node: 1}"], "world.vllm.resources names Ray resources, which SLURM does not have"),
        ([*SLURM, "world.gpus_per_node=2", "world.trainer.gpus=0.5"], "world.trainer.gpus must be a whole number"),
        ([*SLURM, "world.vllm.gpus=1"], "world.vllm.gpus=1 is more than a node has (world.gpus_per_node=0)"),
        ([*SLURM, "world.sbatch_lines=['--output=/tmp/x']"], "world.sbatch_lines ['--output=/tmp/x'] change what rlrun sets itself"),
        ([*SLURM, "world.sbatch_lines=['qos high']"], "is not one sbatch/srun option"),
        ([*SLURM, "world.nodes=0"], "world.nodes must be at least 1"),
        (["world.time=10"], "world.time has no effect here: a SLURM job's setting"),
    ],
)
def test_bad_slurm_settings_are_named(overrides, expected):
    """Config validation names what it knows (each key's range, what has no effect here); SLURM's
    own rules (option lines, GPUs per node, the time limit, the signal's lead, rlrun's own sbatch
    options) are asked by preflight, before anything is submitted or started."""
    settings_refusal(overrides, expected)


@pytest.mark.parametrize(
    "text, seconds",
    [("30", 1800), ("1:30", 90), ("24:00:00", 86400), ("2-0", 172800), ("1-12:30", 131400), ("0-00:01:05", 65), ("UNLIMITED", None), ("1h", None)],
)
def test_time_limits_in_slurms_formats(text, seconds):
    assert slurm_job.time_limit_s(text) == seconds


def test_the_batch_script_is_made_from_the_config(tmp_path):
    cfg, _ = compose([*SLURM, "world.nodes=2", "world.gpus_per_node=8", "world.time=2-00:00:00", "world.partition=gpu",
                      "world.account=rl", "world.signal_lead_s=600", "world.sbatch_lines=['--qos=high','--constraint=h100']"])  # fmt: skip
    script = slurm_job.batch_script(cfg.world, tmp_path / "my run", "rlrun-x", "/venv/bin/python", tmp_path / "out-%j")
    options = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")]
    assert options == [
        "--job-name=rlrun-x", "--nodes=2", "--ntasks-per-node=1", "--exclusive", "--gpus-per-node=8", "--time=2-00:00:00",
        "--partition=gpu", "--account=rl", "--signal=B:USR1@600", "--requeue", "--open-mode=append", f"--output={tmp_path / 'out-%j'}",
        "--qos=high", "--constraint=h100",
    ]  # fmt: skip
    assert script.splitlines()[-1] == f"exec /venv/bin/python -m rlrun resume '{tmp_path / 'my run'}'"
    cfg, _ = compose([*SLURM, "world.cpus_per_node=2", "world.requeue=false"])
    options = slurm_job.sbatch_options(cfg.world, "j", tmp_path)
    assert "--cpus-per-task=2" in options and "--exclusive" not in options and "--no-requeue" in options


def test_starts_without_progress_counts_the_latest_starts_that_ended_where_they_began():
    assert slurm_job.starts_without_progress([], 0) == 0
    assert slurm_job.starts_without_progress([0], 4) == 0  # the first start reached step 4
    assert slurm_job.starts_without_progress([0, 4], 4) == 1
    assert slurm_job.starts_without_progress([0, 4, 4], 4) == 2
    assert slurm_job.starts_without_progress([4, 0, 4], 4) == 1  # only the latest ones in a row


def test_why_slurm_stopped_the_job_is_read_from_slurmstepds_line():
    output = (  # as slurmstepd wrote them on Debian's slurm-wlm 22.05 (job 2 was requeued, then cancelled)
        "slurmstepd-node0: error: *** JOB 2 ON node0 CANCELLED AT 2026-12-03T05:26:54 DUE TO JOB REQUEUE ***\n"
        "slurmstepd-node0: error: *** STEP 2.0 ON node0 CANCELLED AT 2026-12-03T05:29:01 ***\n"
        "slurmstepd-node0: error: *** JOB 2 ON node0 CANCELLED AT 2026-12-03T05:29:01 ***\n"
        "slurmstepd-node0: error: *** JOB 7 ON node0 CANCELLED AT 2026-12-03T05:30:01 DUE TO PREEMPTION ***\n"
    )
    assert slurm_job.cancel_reason(output, "2") == ""
    assert slurm_job.cancel_reason(output, "7") == "PREEMPTION"
    assert slurm_job.cancel_reason(output, "9") is None
    assert [slurm_job.stop_status(r) for r in ("", "PREEMPTION", "TIME LIMIT", None)] == ["cancelled", "preempted", "timed out", "terminated"]


def _job_run(tmp_path, *overrides):
    cfg, _ = compose([*SLURM, *overrides])
    run = RunDir(tmp_path / "run")
    run.create({"kind": "rlrun-run"})
    run.slurm.mkdir()
    return cfg, run, slurm_job.JobEnv("77", 0, "node0", "2")


def test_the_time_limit_signal_requeues_a_job_that_made_progress_and_stops_a_loop(tmp_path):
    cfg, run, job = _job_run(tmp_path, "world.max_starts_without_progress=2")
    requeued = []
    slurm_job.record_start(run, job, cfg.world, step_now=0)
    outcome = slurm_job.after_stop(run, job, cfg.world, "USR1", step_now=3, requeue_job=requeued.append)
    assert outcome.requeued and outcome.status == "requeued" and requeued == ["77"]
    assert run.read_state()["status"] == "requeued"

    again = slurm_job.JobEnv("77", 1, "node0", "2")
    slurm_job.record_start(run, again, cfg.world, step_now=3)
    assert slurm_job.after_stop(run, again, cfg.world, "USR1", step_now=3, requeue_job=requeued.append).requeued  # one start without progress
    slurm_job.record_start(run, slurm_job.JobEnv("77", 2, "node0", "2"), cfg.world, step_now=3)
    stuck = slurm_job.after_stop(run, again, cfg.world, "USR1", step_now=3, requeue_job=requeued.append)
    assert not stuck.requeued and stuck.no_progress and requeued == ["77", "77"]
    assert "started 2 times in a row without a new checkpoint (still step 3)" in stuck.message
    with pytest.raises(RestartsExhausted, match="not requeued again"):  # SLURM requeued it anyway (a node failure)
        slurm_job.record_start(run, slurm_job.JobEnv("77", 3, "node0", "2"), cfg.world, step_now=3)
    slurm_job.record_start(run, slurm_job.JobEnv("78", 0, "node0", "2"), cfg.world, step_now=3)  # `rlrun resume`: a new job starts


def test_sigterm_leaves_the_job_to_slurm_and_says_why_it_stopped(tmp_path):
    cfg, run, job = _job_run(tmp_path)
    requeued = []
    slurm_job.record_start(run, job, cfg.world, step_now=2)
    run.slurm_output("77").write_text("slurmstepd-node0: error: *** JOB 77 ON node0 CANCELLED AT 2026-12-03T05:29:01 ***\n")
    outcome = slurm_job.after_stop(run, job, cfg.world, "TERM", step_now=4, requeue_job=requeued.append)
    assert (outcome.status, outcome.requeued, requeued) == ("cancelled", False, [])
    assert run.read_state()["status"] == "cancelled"
    stopped = [e for e in read_jsonl(run.events) if e["event"] == "slurm_job_stopped"]
    assert stopped[-1]["signal"] == "TERM" and stopped[-1]["reason"] == "" and stopped[-1]["action"] == "stop"
    run.slurm_output("77").write_text("slurmstepd-node0: error: *** JOB 77 ON node0 CANCELLED AT 2026-12-03T05:29:01 DUE TO TIME LIMIT ***\n")
    assert slurm_job.after_stop(run, job, cfg.world, "TERM", step_now=5, requeue_job=requeued.append).requeued  # the limit itself: as USR1
    def refused(job_id):
        raise EnvironmentProblem(f"requeueing job {job_id}: Requested operation is presently disabled")

    outcome = slurm_job.after_stop(run, job, cfg.world, "USR1", step_now=5, requeue_job=refused)  # an salloc, not a batch job
    assert (outcome.status, outcome.requeued) == ("stopped at the time limit", False) and "rlrun resume RUN" in outcome.message
    cfg, run, job = _job_run(tmp_path / "b", "world.requeue=false")
    outcome = slurm_job.after_stop(run, job, cfg.world, "USR1", step_now=1, requeue_job=requeued.append)
    assert outcome.status == "stopped at the time limit" and not outcome.requeued


def test_allocation_values_are_parsed():
    assert slurm_plan.cpus_per_node("72(x2),36") == [72, 72, 36]
    assert slurm_plan.cpus_per_node("2") == [2]
    with pytest.raises(ValueError):
        slurm_plan.cpus_per_node("lots")
    shown = "NodeName=node0 Arch=x86_64 CoresPerSocket=1\n   NodeAddr=127.0.0.1 NodeHostName=vm\n\nNodeName=gpu7 Arch=x86_64\n   NodeAddr=10.0.0.7\n"
    assert slurm_plan.node_addresses(shown) == {"node0": "127.0.0.1", "gpu7": "10.0.0.7"}
    env = {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_CPUS_PER_NODE": "2(x2)"}
    assert slurm_job.JobEnv.from_env(env) == slurm_job.JobEnv("5", 2, "node[0-1]", "2(x2)")
    assert slurm_job.JobEnv.from_env({}) is None


def test_a_step_sees_only_its_gpus_among_those_slurm_gives_the_step():
    assert slurm_step.visible_gpus([2, 3], None) == "2,3"
    assert slurm_step.visible_gpus([0, 1], "4,5,6,7") == "4,5"
    with pytest.raises(ValueError, match="the step sees 2"):
        slurm_step.visible_gpus([2], "0,1")


def test_the_step_wrapper_records_its_pid_and_the_commands_exit(tmp_path):
    import subprocess

    record = tmp_path / "steps" / "x.json"
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n1", "SLURM_STEP_ID": "3", "SLURM_JOB_ID": "9", "CUDA_VISIBLE_DEVICES": "6,7",
           "PYTHONPATH": ":".join(sys.path)}  # fmt: skip

    def step(code: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "rlrun.entrypoints.slurm_step", "--record", str(record), "--gpus", "1", "--", sys.executable, "-c", code]
        return subprocess.run(argv, capture_output=True, text=True, env=env, start_new_session=True)

    probe = step("import os; print(os.getpid(), os.getpgrp(), os.environ['CUDA_VISIBLE_DEVICES'])")
    pid, pgid, gpus = probe.stdout.split()
    recorded = json.loads(record.read_text())
    assert recorded == {"pid": int(pgid), "node": "n1", "job": "9", "step": "3"} and pid != pgid  # the wrapper leads the group
    assert gpus == "7"  # index 1 of the step's GPUs 6,7
    assert probe.returncode == 0 and slurm_step.exit_file(record, 0).read_text() == "0\n"
    killed = step("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -9 and slurm_step.exit_file(record, 0).read_text() == "-9\n"  # ends as its command did
