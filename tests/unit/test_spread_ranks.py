"""A trainer's ranks spread over nodes, without Ray: each node's rank group command and its
torchrun variables, and the one handle the supervisor sees over the node groups (torchrun's
semantics: the first failure fails the process once the others were stopped; 0 only when all
exited 0)."""

from __future__ import annotations

import signal
import sys

import pytest

from rlrun.cluster.ray_world import SpreadHandle
from rlrun.trainer.rank_group import node_command, rank_env

CMD = [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", "3", "--", sys.executable, "-m", "rlrun.entrypoints.trainer", "--x", "1"]


def test_one_nodes_command_carries_torchruns_multi_node_options_and_the_same_program():
    argv = node_command(CMD, nproc=2, first_rank=1, node_rank=1, nnodes=2, world_size=3, master_addr="10.0.0.7", master_port=29511)
    assert argv == [
        sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", "2", "--nnodes", "2", "--node-rank", "1",
        "--first-rank", "1", "--world-size", "3", "--master-addr", "10.0.0.7", "--master-port", "29511",
        "--", sys.executable, "-m", "rlrun.entrypoints.trainer", "--x", "1",
    ]  # fmt: skip


def test_a_command_that_is_not_a_rank_group_or_of_another_size_is_refused():
    with pytest.raises(ValueError, match="not a rank group command"):
        node_command(["torchrun", "--nproc-per-node", "3", "fast-llm"], nproc=1, first_rank=0, node_rank=0, nnodes=2,
                     world_size=3, master_addr="a", master_port=1)  # fmt: skip
    with pytest.raises(ValueError, match="runs 3 ranks, the layout 4"):
        node_command(CMD, nproc=2, first_rank=0, node_rank=0, nnodes=2, world_size=4, master_addr="a", master_port=1)


def test_a_nodes_ranks_get_global_ranks_from_their_first_and_local_ranks_from_0():
    env = rank_env(1, 2, "10.0.0.7", 29511, first_rank=3, world_size=5, node_rank=2, nnodes=3)
    assert env == {"RANK": "4", "LOCAL_RANK": "1", "WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
                   "GROUP_WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29511"}  # fmt: skip


class FakePart:
    """A node's rank group as the spawner's handle to it: its exit status and the signals it got."""

    def __init__(self, pid: int) -> None:
        self.pid, self.node_id = pid, f"node-{pid}"
        self.code: int | None = None
        self.signals: list[int] = []

    def poll(self):
        return self.code

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_process_is_rank_0s_node_group_and_exits_0_only_when_every_node_did():
    parts = [FakePart(11), FakePart(22), FakePart(33)]
    handle = SpreadHandle(parts)
    assert (handle.pid, handle.node_id, handle.descendants()) == (11, "node-11", [])
    assert handle.poll() is None
    parts[1].code = parts[2].code = 0  # the other nodes are done; rank 0's node still writes its checkpoint
    assert handle.poll() is None
    parts[0].code = 0
    assert handle.poll() == 0
    assert all(p.signals == [] for p in parts)


def test_a_failing_node_group_stops_the_others_and_its_status_is_the_processs():
    parts, clock = [FakePart(11), FakePart(22), FakePart(33)], Clock()
    handle = SpreadHandle(parts, grace_s=10, clock=clock)
    parts[1].code = 3
    assert handle.poll() is None  # not before the others are gone: their GPUs, their rendezvous
    assert parts[0].signals == parts[2].signals == [signal.SIGTERM] and parts[1].signals == []
    parts[0].code = 143  # rank 0's node stopped by the SIGTERM (or by its broken collective)
    clock.now = 5
    assert handle.poll() is None  # node 33 still stops
    parts[2].code = -signal.SIGTERM
    assert handle.poll() == 3  # the first failure, not the statuses of the ranks stopped for it
    assert handle.poll() == 3


def test_a_node_group_that_ignores_the_stop_is_killed_after_the_grace():
    parts, clock = [FakePart(11), FakePart(22)], Clock()
    handle = SpreadHandle(parts, grace_s=10, clock=clock)
    parts[1].code = -signal.SIGKILL  # a lost node reads so (its agent is gone)
    assert handle.poll() is None and parts[0].signals == [signal.SIGTERM]
    clock.now = 10
    assert handle.poll() is None and parts[0].signals == [signal.SIGTERM, signal.SIGKILL]
    parts[0].code = -signal.SIGKILL
    assert handle.poll() == -signal.SIGKILL  # the supervisor restarts the whole group from its checkpoint


def test_the_supervisors_signals_reach_every_node():
    parts = [FakePart(11), FakePart(22)]
    handle = SpreadHandle(parts)
    handle.signal_group(signal.SIGTERM)
    handle.signal_group(signal.SIGKILL)
    assert all(p.signals == [signal.SIGTERM, signal.SIGKILL] for p in parts)
