"""world=ray on the real stack: a two-node Ray cluster on 127.0.0.1 (started by the test), vLLM
placed on one node by a custom resource, and the trainer as 2 ranks with a bundle each, one on
each node (each node offers one trainer_node), meeting over gloo as one group. One tiny run
serves every test here: it completes at exactly max_train_steps although its vLLM server is
SIGKILLed on its node mid-run, and afterwards no process of the run remains on either node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import re
from pathlib import Path

import psutil
import pytest

from rlrun.trainer.checkpoint import latest_complete, read_state
from tests.processes import ProcessCollector
from tests.ray_node import LocalRayCluster

from .conftest import RunProcesses, events, read_jsonl, steps_done, wait_for

pytestmark = pytest.mark.e2e

STEPS = 6
RUN_MARKERS = ("rlrun.entrypoints.holder", "ray::NodeAgent")  # a run's processes on a node: its agents, and what they start


def started_pid(run_dir: Path, process: str) -> int:
    """The pid the supervisor tracks for `process`: its (outer) guard, on the process's node."""
    return [e for e in events(run_dir) if e["event"] in ("process_started", "process_restarted") and e["process"] == process][-1]["pid"]


def trainer_ranks_by_node(cluster: LocalRayCluster) -> dict[int, str]:
    """Each trainer rank running now → the node it runs on (rank 0 is titled `rlrun:trainer ARGS`,
    rank r `rlrun:trainer-rank<r> ARGS`; their rank group `rlrun:trainer-ranks ARGS`)."""
    found = {}
    for node_id, node in cluster.nodes.items():
        for p in psutil.Process(node.pid).children(recursive=True):
            try:
                title = re.fullmatch(r"rlrun:trainer(?:-rank(\d+))?", (" ".join(p.cmdline()).split() or [""])[0])
            except psutil.Error:
                continue
            if title:
                found[int(title.group(1) or 0)] = node_id
    return found


def process_under(pid: int) -> psutil.Process:
    """The process itself, below its guards."""
    proc = psutil.Process(pid)
    while any(m in " ".join(proc.cmdline()) for m in ("rlrun.entrypoints.holder", "rlrun.entrypoints.guard")):
        proc = proc.children()[0]
    return proc


class NodeProcesses(ProcessCollector):
    """The run's processes on the cluster's nodes (agents, guards and below), collected while
    the run goes."""

    GRACE_S = 15.0

    def __init__(self, cluster: LocalRayCluster) -> None:
        self.cluster = cluster
        super().__init__()

    def _look(self) -> bool:
        for node in list(self.cluster.nodes.values()):
            try:
                for p in psutil.Process(node.pid).children(recursive=True):
                    try:
                        if any(m in " ".join(p.cmdline()) for m in RUN_MARKERS):
                            for q in [p, *p.children(recursive=True)]:
                                self.seen.add((q.pid, q.create_time()))
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
        self.cluster.record()
        return True


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_world")
    cluster = LocalRayCluster(root / "cluster")
    facts: dict = {}
    proc = None
    try:
        head = cluster.add_node({"trainer_node": 1}, head=True, num_cpus=2)
        # vLLM's bundle holds its actor's CPU too (they share a node), and a trainer rank comes here
        vllm_node = cluster.add_node({"vllm_node": 1, "trainer_node": 1}, num_cpus=3)
        facts["nodes"] = {"head": head, "vllm_node": vllm_node}
        run_dir = root / "run"
        out = open(root / "rlrun.out", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlrun", "train", f"run.dir={run_dir}", "recipe=math_grpo",
             f"trainer.max_train_steps={STEPS}", "trainer.checkpoint_every=2", "supervisor.stop_grace_s=5",
             "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2",
             "world=ray", f"world.address={cluster.address}",
             "world.vllm.resources={vllm_node: 1}", "world.trainer.resources={trainer_node: 1}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **LocalRayCluster.DRIVER_ENV},
        )  # fmt: skip
        local = RunProcesses(proc.pid)  # what runs under rlrun itself (Redis stays with it)
        on_nodes = NodeProcesses(cluster)
        try:
            wait_for(lambda: steps_done(run_dir) >= 1, 900, "step 1", proc)
            facts["placed"] = {name: cluster.node_of(started_pid(run_dir, name)) for name in ("vllm-0", "trainer", "actor", "redis")}
            facts["ranks"] = trainer_ranks_by_node(cluster)
            victim = process_under(started_pid(run_dir, "vllm-0"))
            facts["vllm_cmdline"] = " ".join(victim.cmdline())
            facts["killed_at_step"] = steps_done(run_dir)
            victim.send_signal(signal.SIGKILL)
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            local.stop()
            facts["left_locally"] = local.alive()
            on_nodes.stop()
            facts["left_on_nodes"] = on_nodes.alive()
            facts["run_processes_on_nodes"] = len(on_nodes.seen)
        facts["output"] = (root / "rlrun.out").read_text()
    finally:
        cluster.stop()  # the run is over: the tests below read what it left
        facts["left_by_cluster"] = cluster.left_behind()
        cluster.kill_left_behind()
    return proc.returncode, run_dir, facts


def test_the_run_completes_at_exactly_max_train_steps(ray_run):
    code, run_dir, facts = ray_run
    assert code == 0, facts["output"][-4000:]
    assert read_state(latest_complete(run_dir / "checkpoints")).step == STEPS
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"


def test_vllm_and_the_trainers_ranks_run_on_the_nodes_their_resources_pick(ray_run):
    _, _, facts = ray_run
    nodes = facts["nodes"]
    assert facts["placed"]["vllm-0"] == nodes["vllm_node"]
    assert set(facts["ranks"]) == {0, 1} and set(facts["ranks"].values()) == set(nodes.values())  # a rank on each node
    assert facts["placed"]["trainer"] == facts["ranks"][0]  # the supervisor's pid: rank 0's node group
    assert facts["placed"]["actor"] == nodes["vllm_node"]  # next to its vLLM server
    assert facts["placed"]["redis"] is None  # not under a Ray node: a child of rlrun itself
    assert "vllm.entrypoints.openai.api_server" in facts["vllm_cmdline"]


def test_the_killed_vllm_is_restarted_on_its_node_and_the_run_completes(ray_run):
    code, run_dir, facts = ray_run
    assert facts["killed_at_step"] < STEPS
    evs = events(run_dir)
    failed = [e for e in evs if e["event"] == "process_failed" and e["process"] == "vllm-0"]
    assert failed and "SIGKILL" in failed[0]["reason"] and failed[0]["action"] == "restart"
    assert sum(1 for e in evs if e["event"] == "process_ready" and e["process"] == "vllm-0") >= 2
    assert (run_dir / "logs" / "launch-1" / "vllm-0.1.log").is_file()  # the restart wrote its own log, on its node
    assert not any(e["event"] == "process_restarted" and e["process"] == "redis" for e in evs)
    assert code == 0


def test_no_process_of_the_run_remains_on_either_node(ray_run):
    _, _, facts = ray_run
    assert facts["run_processes_on_nodes"] >= 10  # agents, guards, vLLM (twice), 2 trainer rank groups and ranks, actor
    assert facts["left_on_nodes"] == []
    assert facts["left_locally"] == []


def test_nothing_is_left_once_the_cluster_is_stopped(ray_run):
    _, _, facts = ray_run
    assert facts["left_by_cluster"] == []
