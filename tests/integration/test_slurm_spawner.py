"""The world=slurm spawner against a real SLURM (tests/slurm_cluster.py: slurm-wlm 22.05, one node on
127.0.0.1), in an allocation made by `salloc --no-shell`: a placed process is an srun step whose
pid (its own process group) and node come back from the step, signals reach it through SLURM, a
kill leaves nothing, an exit status passes through srun, secrets stay off the command line.
~15 s. Skipped where SLURM cannot be started (the reason is in the skip)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from rlrun.cluster import slurm_job, slurm_plan
from rlrun.cluster.slurm_world import SlurmSpawner
from rlrun.cluster.world import allocation_nodes
from rlrun.config import compose
from rlrun.run.built import build
from rlrun.supervisor.local import LocalHandle
from rlrun.supervisor.spec import ProcessSpec
from tests.slurm_cluster import LocalSlurm, available
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(available() is not None, reason=str(available()))]

# Reports its pid, process group, node's view of its GPUs and a secret, then waits; SIGTERM: says so, exits 0.
PROBE = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    def write(line):
        with open(out, "a") as f:
            f.write(line + "\\n")
    signal.signal(signal.SIGTERM, lambda *_: (write("term"), sys.exit(0)))
    write(f"{os.getpid()} {os.getpgrp()} {os.environ.get('SLURMD_NODENAME')} {os.environ.get('RLRUN_TEST_SECRET')}")
    while True:
        time.sleep(0.1)
    """
)


@pytest.fixture(scope="module")
def allocation(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_spawner")
    with LocalSlurm(root / "cluster") as slurm:
        granted = subprocess.run(["salloc", "--no-shell", "--exclusive", "--time=10"], capture_output=True, text=True, env=slurm.env, cwd=root)
        job = re.search(r"Granted job allocation (\d+)", granted.stderr).group(1)
        cfg, _ = compose(["world=slurm", "world.placement_timeout_s=30", "world.actor.cpus=0"])
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])  # the spawner's own SLURM commands find the cluster
            nodes = allocation_nodes(cfg, slurm_job.JobEnv(job, 0, "node0", slurm.job_field(job, "NumCPUs")), "node0")
            plan = build(cfg).world.slurm_plan(nodes)
            yield slurm, job, plan, SlurmSpawner(plan, job, root / "steps", start_timeout_s=30), root


def wait_exit(handle, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while (code := handle.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return code


def probe_spec(root, name: str, out, **extra) -> ProcessSpec:
    return ProcessSpec(name=name, argv=[sys.executable, "-c", PROBE, str(out)], log_path=root / "logs" / f"{name}.log", **extra)


def test_the_allocation_is_read_from_slurm(allocation):
    _, _, plan, _, _ = allocation
    assert [(n.name, n.address, n.cpus) for n in plan.nodes] == [("node0", "127.0.0.1", 2)]
    assert plan.placed["redis"].local and plan.placed["vllm-0"].nodes == ["node0"]
    assert slurm_plan.server_hosts(plan) == {}  # one node: servers listen where the config says


def test_a_step_reports_its_own_group_and_node_and_stops_on_sigterm_through_slurm(allocation):
    slurm, job, _, spawner, root = allocation
    out, secret = root / "vllm.out", root / "secret"
    secret.write_text("s3cr3t-value\n")
    handle = spawner.spawn(probe_spec(root, "vllm-0", out, secret_env={"RLRUN_TEST_SECRET": secret}))
    # The file exists from the probe's open(), before its line is written: wait for the whole line.
    wait_until(lambda: out.exists() and out.read_text().endswith("\n"), 20, "the probe's report")
    pid, pgid, node, seen_secret = out.read_text().split()
    assert (handle.pid, handle.node) == (int(pgid), "node0")  # what probes compare: the group it runs in
    assert re.fullmatch(rf"{job}\.\d+", handle.step)
    assert seen_secret == "s3cr3t-value"
    srun = psutil.Process(handle._srun.pid)
    assert "s3cr3t-value" not in " ".join(srun.cmdline()) and "--overlap" in srun.cmdline()
    handle.signal_group(signal.SIGTERM)
    assert wait_exit(handle) == 0
    assert out.read_text().splitlines()[-1] == "term"  # the process's own handler ran
    assert not psutil.pid_exists(int(pid))


def test_a_kill_leaves_nothing_and_an_exit_status_passes_through(allocation):
    slurm, _, _, spawner, root = allocation
    out, termed = root / "trainer.out", root / "trainer.term"
    stubborn = ProcessSpec(name="trainer", argv=[sys.executable, "-c", "import signal, time, sys\n"
                           f"signal.signal(signal.SIGTERM, lambda *_: open({str(termed)!r}, 'w').write('term'))\n"
                           f"open({str(out)!r}, 'w').write('up')\nwhile True: time.sleep(600)"], log_path=root / "logs" / "trainer.log")  # fmt: skip
    handle = spawner.spawn(stubborn)
    wait_until(out.exists, 20, "the trainer to start")
    assert psutil.pid_exists(handle.pid)
    handle.signal_group(signal.SIGTERM)  # passed over by the process, which the step wrapper waits for
    wait_until(termed.exists, 20, "the trainer to be sent SIGTERM")
    assert handle.poll() is None
    handle.signal_group(signal.SIGKILL)
    assert wait_exit(handle) not in (None, 0)
    assert not psutil.pid_exists(handle.pid) or psutil.Process(handle.pid).status() == psutil.STATUS_ZOMBIE

    failing = ProcessSpec(name="trainer", argv=[sys.executable, "-c", "raise SystemExit(2)"], log_path=root / "logs" / "trainer.1.log")
    assert wait_exit(spawner.spawn(failing)) == 2  # a configuration error is not retried by the supervisor


def test_a_process_beside_the_supervisor_is_a_local_child(allocation):
    _, _, _, spawner, root = allocation
    handle = spawner.spawn(ProcessSpec(name="redis", argv=[sys.executable, "-c", "pass"], log_path=root / "logs" / "redis.log"))
    assert isinstance(handle, LocalHandle) and wait_exit(handle) == 0


def test_a_job_cancel_reaches_every_step_and_each_reads_as_ended_when_its_process_is(tmp_path):
    """scancel of the job: SLURM signals every process of every step at once (SIGKILL KillWait
    later). Each process reads as ended with its own status as soon as it has ended, from the
    step's own report: the srun clients in a batch step are signalled too and then may wait for
    the whole job's end (seen in tests/e2e/test_slurm_e2e.py, where they run there)."""
    root = tmp_path
    with LocalSlurm(tmp_path / "cluster") as slurm, pytest.MonkeyPatch.context() as patch:
        granted = subprocess.run(["salloc", "--no-shell", "--time=10"], capture_output=True, text=True, env=slurm.env, cwd=root)
        job = re.search(r"Granted job allocation (\d+)", granted.stderr).group(1)
        cfg, _ = compose(["world=slurm", "world.placement_timeout_s=30", "world.vllm.cpus=0", "world.actor.cpus=0", "world.trainer.cpus=0"])
        patch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
        plan = build(cfg).world.slurm_plan(allocation_nodes(cfg, slurm_job.JobEnv(job, 0, "node0", "1"), "node0"))
        spawner = SlurmSpawner(plan, job, root / "cancel-steps", start_timeout_s=30)
        # Each says "up" once set up (its SIGTERM handler, its title): spawn returns when the step
        # has started the process, before Python has run a line of it, and a cancel that came
        # earlier would end the trainer by SIGTERM's default action and the actor untitled.
        slow = ("import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2), open(sys.argv[1], 'w').write('done'), sys.exit(0)))\n"
                "open(sys.argv[2], 'w').close()\n"
                "time.sleep(600)")  # fmt: skip
        done, trainer_up, actor_up = root / "trainer-done", root / "trainer-up", root / "actor-up"
        trainer = spawner.spawn(ProcessSpec(name="trainer", argv=[sys.executable, "-c", slow, str(done), str(trainer_up)], log_path=root / "c-trainer.log"))
        # Titled as rlrun's roles are: SLURM's proctrack/linuxproc skipped a process whose short
        # name held a space (`rlrun:actor /tm`): it was never signalled, nor killed with the job.
        titled = ("import sys, time; from rlrun.telemetry import proctitle; proctitle.name('actor')\n"
                  "open(sys.argv[2], 'w').close()\n"
                  "time.sleep(600)")  # fmt: skip
        actor = spawner.spawn(ProcessSpec(name="actor", argv=[sys.executable, "-c", titled, "/run/roles/actor.yaml", str(actor_up)], log_path=root / "c-actor.log"))
        wait_until(lambda: trainer_up.exists() and actor_up.exists(), 30, "the trainer and the actor to be set up")
        cancelled = time.monotonic()
        slurm.run("scancel", job)
        codes = [wait_exit(trainer, timeout=20), wait_exit(actor, timeout=20)]
        took = time.monotonic() - cancelled
    assert codes == [0, -signal.SIGTERM] and done.read_text() == "done"  # the trainer's stop ran to its end
    assert took < 15  # well before KillWait (30 s)


# One rank of a 2-rank group: joins over gloo as rank_group set it up, all-reduces its rank + 1,
# and reports where it ran and what it got.
RANK = textwrap.dedent(
    """
    import json, os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(total)
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"node": os.environ["SLURMD_NODENAME"], "sum": total.item(), "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
                   "master": os.environ["MASTER_ADDR"], "pgid": os.getpgrp()}, f)
    dist.destroy_process_group()
    """
)


def test_a_trainer_spanning_two_nodes_is_one_step_whose_ranks_meet_at_the_first(tmp_path):
    """Two nodes in network namespaces (tests/slurm_cluster.py), where this machine has them."""
    from tests.slurm_cluster import NamespacesUnavailable

    try:
        cluster = LocalSlurm(tmp_path / "cluster", nodes=[("node0", 1), ("node1", 1)])
        cluster.__enter__()
    except NamespacesUnavailable as exc:
        pytest.skip(f"two nodes need network namespaces: {exc}")
    try:
        granted = subprocess.run(["salloc", "--no-shell", "--nodes=2", "--exclusive", "--time=10"], capture_output=True, text=True, env=cluster.env, cwd=tmp_path)
        job = re.search(r"Granted job allocation (\d+)", granted.stderr).group(1)
        cfg, _ = compose(["world=slurm", "world.placement_timeout_s=60", "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2",
                          "world.vllm.cpus=0", "world.actor.cpus=0"])  # only the trainer is started here
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
            plan = build(cfg).world.slurm_plan(allocation_nodes(cfg, slurm_job.JobEnv(job, 0, "node[0-1]", "1(x2)"), "node0"))
            assert [(s.node, s.first_rank) for s in plan.placed["trainer"].shares] == [("node0", 0), ("node1", 1)]
            spawner = SlurmSpawner(plan, job, tmp_path / "steps", start_timeout_s=60)
            out = tmp_path / "ranks"
            out.mkdir()
            argv = [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", "2", "--", sys.executable, "-c", RANK, str(out)]
            handle = spawner.spawn(ProcessSpec(name="trainer", argv=argv, log_path=tmp_path / "trainer.log"))
            assert wait_exit(handle, timeout=120) == 0, (tmp_path / "trainer.log").read_text()[-2000:]
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert [r["node"] for r in ranks] == ["node0", "node1"]
        assert [r["sum"] for r in ranks] == [3.0, 3.0]  # 1 + 2: they met
        assert {r["master"] for r in ranks} == {cluster.addresses["node0"]} and {r["ifname"] for r in ranks} == {"eth0"}
        assert handle.node == "node0" and handle.pid == ranks[0]["pgid"]  # the pid the supervisor tracks: rank 0's node's group
    finally:
        cluster.stop()
