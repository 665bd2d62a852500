"""world=ray on a real Ray cluster on 127.0.0.1 (two nodes, more for node loss): placement by custom resources, the node
agent's handles (poll, signals, secrets), the guard taking a group down with its agent, clear
errors (no cluster, too few resources), a lost node's process restarted elsewhere (or a clear stop
without room), the supervisor unchanged on top, and no
process left once the cluster is stopped."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest
import ray  # in the test extra: missing, this module fails to import rather than skips

from rlrun.cluster.ray_world import RaySpawner, connect
from rlrun.config.schema import WorldConfig
from rlrun.errors import EnvironmentProblem
from rlrun.supervisor import EventLog, ProcessSpec, RunVerdict, Supervisor
from rlrun.supervisor.policy import RestartPolicy
from tests.ray_node import LocalRayCluster

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head {trainer_node: 1}, second node {vllm_node: 1}, each {rank_slot: 1} (one trainer rank per
    node); this process is the Ray driver."""
    import ray._private.ray_constants as ray_constants

    saved = {k: os.environ.get(k) for k in LocalRayCluster.DRIVER_ENV}
    os.environ.update(LocalRayCluster.DRIVER_ENV)
    enable_cluster, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False  # read once, at import
    c = LocalRayCluster(tmp_path_factory.mktemp("ray"))
    try:
        c.head = c.add_node({"trainer_node": 1, "rank_slot": 1}, head=True, num_cpus=2)
        c.vllm_node = c.add_node({"vllm_node": 1, "rank_slot": 1}, num_cpus=2)
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        left = c.left_behind()
        c.kill_left_behind()
        ray_constants.ENABLE_RAY_CLUSTER = enable_cluster
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        assert left == [], f"processes left after the cluster stopped: {left}"


def world(cluster, timeout_s: float = 30.0) -> WorldConfig:
    return WorldConfig(kind="ray", address=cluster.address, placement_timeout_s=timeout_s)


def child_of(guard_pid: int) -> psutil.Process:
    """The process itself, under its guards (on this machine, as every node of the test is)."""
    proc, deadline = psutil.Process(guard_pid), time.time() + 30
    while any(m in " ".join(proc.cmdline()) for m in ("rlrun.entrypoints.guard", "rlrun.entrypoints.holder")):
        children = proc.children()
        if children:
            proc = children[0]
        elif time.time() > deadline:
            raise AssertionError(f"guard {proc.pid} started no child")
        else:
            time.sleep(0.1)
    return proc


def wait_exit(handle, timeout: float = 30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        code = handle.poll()
        if code is not None:
            return code
        time.sleep(0.1)
    raise AssertionError(f"process {handle.pid} still running after {timeout} s")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def left(pids: list[int], timeout: float = 15.0) -> list[int]:
    """Those of `pids` still running after `timeout` (a lost node's processes die a moment after it)."""
    deadline = time.time() + timeout
    while any(not gone(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.2)
    return [pid for pid in pids if not gone(pid)]


def test_no_cluster_at_the_address_names_it_and_how_to_start_one():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EnvironmentProblem) as info:
        connect(f"127.0.0.1:{port}")
    message = str(info.value)
    assert f"world.address=127.0.0.1:{port}" in message and "ray start --head" in message


def test_a_loopback_address_that_ray_would_rewrite_is_explained(cluster, monkeypatch):
    import ray._private.ray_constants as ray_constants

    from rlrun.cluster.ray_world import _check_reachable

    _check_reachable(cluster.address)  # as the tests run it: fine
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)  # as Ray is by default on Linux
    with pytest.raises(EnvironmentProblem, match="RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"):
        _check_reachable(cluster.address)


def test_an_actor_runs_on_the_node_of_its_vllm_server(cluster, tmp_path):
    """actor.num_actors: each actor shares the bundle, so the node, of its first server, although
    its own resources (a CPU) would fit on any node."""
    bundles = {"vllm-0": [{"vllm_node": 1}], "trainer": [{"trainer_node": 1}], "actor-0": [{"CPU": 0.5}]}
    spawner = RaySpawner(world(cluster), bundles, "t-colocate", anchors={"actor-0": "vllm-0"})
    try:
        actor = spawner.spawn(ProcessSpec("actor-0", SLEEPER, tmp_path / "logs" / "actor-0.log"))
        server = spawner.spawn(ProcessSpec("vllm-0", SLEEPER, tmp_path / "logs" / "vllm-0.log"))
        assert actor.node_id == server.node_id == cluster.vllm_node
        assert cluster.node_of(actor.pid) == cluster.vllm_node
        for handle in (actor, server):
            handle.signal_group(signal.SIGTERM)
            assert wait_exit(handle) == -signal.SIGTERM
    finally:
        spawner.close()


def test_a_process_runs_on_the_node_its_resources_pick_and_answers_through_its_agent(cluster, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-value\n")
    secret.chmod(0o600)
    spawner = RaySpawner(world(cluster), {"vllm-0": [{"vllm_node": 1}], "trainer": [{"trainer_node": 1}]}, "t-place")
    try:
        spec = ProcessSpec("vllm-0", SLEEPER, tmp_path / "logs" / "vllm-0.log", env={"PLAIN": "1"}, secret_env={"THE_KEY": secret})
        handle = spawner.spawn(spec)
        trainer = spawner.spawn(ProcessSpec("trainer", SLEEPER, tmp_path / "logs" / "trainer.log"))
        # the agent reports the node its bundle is on, and the process really hangs under that node
        assert handle.node_id == cluster.vllm_node and cluster.node_of(handle.pid) == cluster.vllm_node
        assert trainer.node_id == cluster.head and cluster.node_of(trainer.pid) == cluster.head
        # the guard leads a group of its own; output goes to the spec's log file
        assert os.getpgid(handle.pid) == handle.pid
        child = child_of(handle.pid)
        deadline = time.time() + 20
        while "up" not in spec.log_path.read_text() and time.time() < deadline:
            time.sleep(0.1)
        assert "up" in spec.log_path.read_text()
        # the secret reaches the environment, never a command line
        assert child.environ()["THE_KEY"] == "s3cret-value" and child.environ()["PLAIN"] == "1"
        assert not any("s3cret" in " ".join(p.cmdline()) for p in [child, psutil.Process(handle.pid)])
        assert "RAY_JOB_ID" not in child.environ()  # the agent's Ray worker variables stay with it
        assert handle.poll() is None

        child.kill()  # SIGKILL of the process itself (not its guard): seen as killed by SIGKILL
        assert wait_exit(handle) == -signal.SIGKILL

        trainer.signal_group(signal.SIGTERM)
        assert wait_exit(trainer) == -signal.SIGTERM
        cluster.record()
    finally:
        spawner.close()


def test_the_guard_kills_the_group_when_its_agent_dies(cluster, tmp_path):
    spawner = RaySpawner(world(cluster), {"vllm-0": [{"vllm_node": 1}]}, "t-agent")
    try:
        escaping = [sys.executable, "-c", (
            "import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "time.sleep(600)\n"
        )]  # fmt: skip
        handle = spawner.spawn(ProcessSpec("vllm-0", escaping, tmp_path / "vllm-0.log"))
        child = child_of(handle.pid)
        deadline = time.time() + 20
        while not child.children() and time.time() < deadline:
            time.sleep(0.1)
        group = [handle.pid, child.parent().pid, child.pid, *(p.pid for p in child.children())]
        assert len(group) == 4  # outer guard, guard, the process, its child
        cluster.record()

        ray.kill(spawner._agents[handle.node_id])  # the node agent dies (as with its node)
        assert left(group) == []
        assert wait_exit(handle) == -signal.SIGKILL  # read as killed: the supervisor restarts it

        # its bundle's node is still there: a restart gets a new agent on the same node
        again = spawner.spawn(ProcessSpec("vllm-0", SLEEPER, tmp_path / "vllm-0.1.log"))
        assert again.node_id == cluster.vllm_node and again.poll() is None
        cluster.record()
    finally:
        spawner.close()


def test_too_few_resources_are_named_before_anything_starts(cluster, tmp_path):
    started = []

    class RecordingLocal:
        def spawn(self, spec):
            started.append(spec.name)
            raise AssertionError("nothing may start")

    spawner = RaySpawner(
        world(cluster, timeout_s=5),
        {"redis": [], "vllm-0": [{"GPU": 1}], "vllm-1": [{"vllm_node": 1}], "vllm-2": [{"vllm_node": 1}]},
        "t-short",
        local=RecordingLocal(),
    )
    with pytest.raises(EnvironmentProblem) as info:
        spawner.spawn(ProcessSpec("redis", SLEEPER, tmp_path / "redis.log"))  # the first, local, process
    message = str(info.value)
    assert "vllm-0 needs GPU 1 on one node, and no node has that" in message
    assert "vllm_node: 2 needed in all (vllm-1, vllm-2), the cluster has 1" in message
    assert "trainer_node 1" in message  # the nodes and what they offer are listed
    assert started == []


def test_the_supervisor_restarts_a_killed_remote_process_and_stops_everything(cluster, tmp_path):
    restart = RestartPolicy(restart=True, max_restarts=3, window_s=600, backoff_initial_s=0.2, backoff_max_s=1, healthy_after_s=60)
    specs = [
        ProcessSpec("redis", SLEEPER, tmp_path / "redis.log", restart=restart, stop_grace_s=5),  # local
        ProcessSpec("vllm-0", SLEEPER, tmp_path / "vllm-0.log", restart=restart, stop_grace_s=5),
    ]
    spawner = RaySpawner(world(cluster), {"redis": [], "vllm-0": [{"vllm_node": 1}]}, "t-sup")
    events = EventLog(tmp_path / "events.jsonl")
    sup = Supervisor(specs, events, spawner=spawner, poll_interval_s=0.2)
    try:
        sup.start_all()
        first = sup.status("vllm-0").pid
        assert cluster.node_of(first) == cluster.vllm_node and cluster.node_of(sup.status("redis").pid) is None
        child_of(first).kill()
        deadline = time.time() + 60
        sup.watch(lambda exits: RunVerdict(sup.status("vllm-0").attempt >= 1 and sup.status("vllm-0").state.value == "ready" or time.time() > deadline, ""))
        status = sup.status("vllm-0")
        assert status.attempt == 1 and status.pid != first and cluster.node_of(status.pid) == cluster.vllm_node
        failed = [e for e in events.recorded if e["event"] == "process_failed"]
        assert failed[0]["process"] == "vllm-0" and "SIGKILL" in failed[0]["reason"] and failed[0]["action"] == "restart"
        assert (tmp_path / "vllm-0.1.log").is_file()  # the restart's own log, written on its node
        cluster.record()
        pids = [p.pid for p in sup.processes]
    finally:
        sup.stop_all()
        spawner.close()
    assert all(gone(pid) for pid in pids)


# A rank of a group spread over nodes: joins torch.distributed (gloo) at the rendezvous its rank
# group was given, all-reduces its rank + 1, and writes what it saw with the pids of its ancestors
# (the test finds its node from them, after it has exited).
RANK = """
import json, os, sys
import psutil
out, action = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
seen = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")}
seen |= {"pid": os.getpid(), "ancestors": [p.pid for p in psutil.Process().parents()]}
if action == "all_reduce":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)  # env://: MASTER_ADDR, MASTER_PORT
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    seen["sum"] = total.item()
    dist.destroy_process_group()
with open(f"{out}/rank{rank}.tmp", "w") as f:
    json.dump(seen, f)
os.rename(f"{out}/rank{rank}.tmp", f"{out}/rank{rank}.json")
if action == "rank1-fails":
    import time
    if rank == 1:
        while not os.path.exists(f"{out}/rank0.json"):  # the other node's rank runs: it must be stopped
            time.sleep(0.05)
        sys.exit(3)
    time.sleep(600)
"""


def rank_group_spec(tmp_path, action: str, nproc: int = 2) -> ProcessSpec:
    argv = [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", str(nproc), "--", sys.executable, "-c", RANK, str(tmp_path), action]
    return ProcessSpec("trainer", argv, tmp_path / "trainer.log")


def ranks_seen(cluster, tmp_path, nproc: int, timeout: float = 60.0) -> list[dict]:
    files, deadline = [tmp_path / f"rank{r}.json" for r in range(nproc)], time.time() + timeout
    while not all(f.is_file() for f in files):
        assert time.time() < deadline, (tmp_path / "trainer.log").read_text()[-3000:]
        time.sleep(0.1)
    seen = [json.loads(f.read_text()) for f in files]
    for rank in seen:  # the node whose process tree held the rank
        rank["node"] = next((node for node, proc in cluster.nodes.items() if proc.pid in rank["ancestors"]), None)
    return seen


def test_a_trainers_ranks_on_two_nodes_form_one_torch_distributed_group(cluster, tmp_path):
    """One bundle per rank, each asking for the rank_slot that each node offers once: the two
    ranks land on different nodes, run as a rank group on each, and meet at rank 0's node."""
    spawner = RaySpawner(world(cluster), {"trainer": [{"rank_slot": 1}, {"rank_slot": 1}]}, "t-spread")
    try:
        handle = spawner.spawn(rank_group_spec(tmp_path, "all_reduce"))
        assert {part.node_id for part in handle.parts} == {cluster.head, cluster.vllm_node}
        cluster.record()
        assert wait_exit(handle, timeout=120) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
        ranks = ranks_seen(cluster, tmp_path, 2)
        assert [r["sum"] for r in ranks] == [3.0, 3.0]  # 1 + 2: the all_reduce crossed the nodes
        assert {r["node"] for r in ranks} == {cluster.head, cluster.vllm_node}  # one rank on each node
        assert ranks[0]["node"] == handle.node_id  # the supervisor's pid: rank 0's node group
        assert [(r["RANK"], r["LOCAL_RANK"], r["GROUP_RANK"]) for r in ranks] == [("0", "0", "0"), ("1", "0", "1")]
        assert {(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in ranks} == {("127.0.0.1", ranks[0]["MASTER_PORT"])}
    finally:
        spawner.close()


def test_a_failing_rank_on_one_node_fails_the_group_no_rank_is_left_and_a_restart_meets_again(cluster, tmp_path):
    spawner = RaySpawner(world(cluster), {"trainer": [{"rank_slot": 1}, {"rank_slot": 1}]}, "t-spread-fail")
    try:
        handle = spawner.spawn(rank_group_spec(tmp_path, "rank1-fails"))
        ranks = ranks_seen(cluster, tmp_path, 2)
        assert ranks[0]["node"] != ranks[1]["node"]
        guards = [part.pid for part in handle.parts]
        cluster.record()
        assert wait_exit(handle, timeout=60) == 3  # the failed rank's status, as with torchrun
        assert all(gone(pid) for pid in [*guards, *(r["pid"] for r in ranks)])  # rank 0, on the other node, was stopped

        # the supervisor's restart is a new spawn: the ranks meet again, at a port found anew
        again_dir = tmp_path / "again"
        again_dir.mkdir()
        again = spawner.spawn(rank_group_spec(again_dir, "all_reduce"))
        assert wait_exit(again, timeout=120) == 0, (again_dir / "trainer.log").read_text()[-3000:]
        assert [r["sum"] for r in ranks_seen(cluster, again_dir, 2)] == [3.0, 3.0]
    finally:
        spawner.close()


def test_a_lost_nodes_process_is_restarted_elsewhere_and_without_room_the_restart_stops_clearly(cluster, tmp_path):
    spares = {cluster.add_node({"spare_node": 1}, num_cpus=1), cluster.add_node({"spare_node": 1}, num_cpus=1)}
    spawner = RaySpawner(world(cluster, timeout_s=20), {"actor": [{"spare_node": 1}]}, "t-lost")
    try:
        handle = spawner.spawn(ProcessSpec("actor", SLEEPER, tmp_path / "actor.log"))
        first = cluster.node_of(handle.pid)
        assert first in spares
        child = child_of(handle.pid)
        cluster.stop_node(first)  # the whole node goes: raylet, agent, and so the guard's group
        assert wait_exit(handle, timeout=90) == -signal.SIGKILL  # read as killed: restarted
        assert left([child.pid, handle.pid]) == []

        # Ray moves the bundle to the node that still has a spare_node; a new agent starts there
        again = spawner.spawn(ProcessSpec("actor", SLEEPER, tmp_path / "actor.1.log"))
        (second,) = spares - {first}
        assert again.node_id == second and cluster.node_of(again.pid) == second and again.poll() is None

        cluster.stop_node(second)  # and now no node is left with room for it
        assert wait_exit(again, timeout=90) == -signal.SIGKILL
        with pytest.raises(EnvironmentProblem) as info:
            spawner.spawn(ProcessSpec("actor", SLEEPER, tmp_path / "actor.2.log"))
        message = str(info.value)
        assert "actor cannot be started again" in message and "spare_node 1" in message and "rlrun resume" in message
    finally:
        spawner.close()
