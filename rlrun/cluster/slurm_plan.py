"""world=slurm as plain data (SLURM is not asked): which node of the allocation each process runs
on, with which of its GPUs, and the `srun` step that starts it.

The rules are world=ray's (`placement.py`): per process a bundle of `world.<role>.{cpus,gpus}`
(the hf trainer one per rank, so its ranks may span nodes; Fast-LLM's ranks one bundle on one
node), actors in one bundle with their first vLLM server, `local` roles (Redis by default) beside
the supervisor in the batch step, reserving nothing. Bundles are packed first-fit onto the nodes in
allocation order, as Ray's PACK strategy keeps them on as few nodes as fit. Every step runs with
`--overlap` (SLURM gives a step all the job's CPUs and GPUs on its nodes otherwise, and the next
step would wait): the division of each node is rlrun's, and each step sees its GPUs only
(`slurm_step.py` narrows CUDA_VISIBLE_DEVICES to them). Knows nothing of what a process does.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlrun.cluster import placement
from rlrun.config.schema import WorldConfig

STEP_MODULE = "rlrun.entrypoints.slurm_step"


class DoesNotFit(ValueError):
    """The processes' bundles cannot be packed onto the nodes; the message says what is short."""


@dataclass(frozen=True)
class Node:
    name: str  # as SLURM names it (srun --nodelist)
    address: str  # where processes on other nodes reach its servers (SLURM's NodeAddr)
    cpus: Optional[int]  # CPUs the job has there; None: not known yet (whole nodes, outside the allocation)
    gpus: int  # GPUs the job has there


@dataclass(frozen=True)
class NodeShare:
    """The ranks of one placed process on one node (one srun task there)."""

    node: str
    node_rank: int  # 0: the node of rank 0, where the ranks meet
    first_rank: int
    nproc: int
    gpus: tuple[int, ...]  # indices among the job's GPUs on that node


@dataclass(frozen=True)
class Placed:
    process: str
    shares: tuple[NodeShare, ...]  # () for a process beside the supervisor (world.<role>.local)
    cpus: float  # CPUs per rank it accounts for
    anchor: Optional[str] = None  # the process whose node it shares (an actor: its first vLLM server)

    @property
    def local(self) -> bool:
        return not self.shares

    @property
    def nodes(self) -> list[str]:
        return [share.node for share in self.shares]

    @property
    def ranks(self) -> int:
        return sum(share.nproc for share in self.shares)


@dataclass(frozen=True)
class Plan:
    nodes: tuple[Node, ...]  # the allocation, batch node (the supervisor's) first
    placed: dict[str, Placed]  # by process, in start order

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    @property
    def batch_node(self) -> Node:
        return self.nodes[0]

    def spans_nodes(self) -> bool:
        """Whether any process runs elsewhere than beside the supervisor."""
        return any(n != self.batch_node.name for p in self.placed.values() for n in p.nodes)


def plan(
    world: WorldConfig,
    processes: list[str],
    ranks: dict[str, int],
    spread: frozenset[str],
    anchors: dict[str, str],
    nodes: list[Node],
) -> Plan:
    """Place `processes` (start order) on `nodes` (the allocation's, batch node first); DoesNotFit
    naming the process that does not fit and what the nodes have left."""
    if not nodes:
        raise DoesNotFit("the allocation has no node")
    per_rank: dict[str, placement.Bundle] = {}
    wanted: dict[str, list[placement.Bundle]] = {}
    for name in processes:
        role = getattr(world, placement.role_of(name))
        per_rank[name] = {"CPU": float(role.cpus), "GPU": float(role.gpus)}
        n = ranks.get(name, 1)
        if role.local:
            wanted[name] = []
        elif name in spread:
            wanted[name] = [dict(per_rank[name]) for _ in range(n)]
        else:
            wanted[name] = [placement.rank_bundle(per_rank[name], n)]
    reserved, owner = placement.colocate(wanted, anchors)
    free = {n.name: {"CPU": float("inf") if n.cpus is None else float(n.cpus), "GPU": float(n.gpus)} for n in nodes}
    landed: dict[str, list[str]] = {}  # owner process → the node of each of its bundles
    for name, bundles in reserved.items():
        landed[name] = []
        for k, bundle in enumerate(bundles):
            node = next((n.name for n in nodes if all(free[n.name][r] >= amount for r, amount in bundle.items())), None)
            if node is None:
                asked = placement.describe({r: amount for r, amount in bundle.items() if amount})
                what = f"{name}{f' rank {k}' if len(bundles) > 1 else ''} needs {asked} on one node"
                together = [p for p, o in owner.items() if o == name and p != name]
                if together:
                    what += f" (with {', '.join(together)}, which runs beside it)"
                left = "; ".join(f"{n.name}: {placement.describe(free[n.name])}" for n in nodes)
                raise DoesNotFit(f"{what}, and no node has that left (after the processes before it). Left: {left}")
            for resource, amount in bundle.items():
                free[node][resource] -= amount
            landed[name].append(node)
    next_gpu: Counter[str] = Counter()
    out: dict[str, Placed] = {}
    for name in processes:
        if not wanted[name]:
            out[name] = Placed(name, (), per_rank[name]["CPU"])
            continue
        host = owner[name]
        bundle_nodes = landed[host] if host == name else landed[host][:1]
        gpus_per_rank = int(per_rank[name]["GPU"])
        shares = []
        if name in spread:
            layout = placement.node_ranks(bundle_nodes)
        else:
            layout = [placement.NodeRanks(bundle_nodes[0], 0, 0, ranks.get(name, 1))]
        for group in layout:
            count = gpus_per_rank * group.nproc
            shares.append(
                NodeShare(
                    group.node,
                    group.node_rank,
                    group.first_rank,
                    group.nproc,
                    tuple(range(next_gpu[group.node], next_gpu[group.node] + count)),
                )
            )
            next_gpu[group.node] += count
        out[name] = Placed(name, tuple(shares), per_rank[name]["CPU"], anchor=host if host != name else None)
    return Plan(tuple(nodes), out)


SERVERS = ("redis", "vllm", "trainer")  # roles others connect to (the trainer: its weight broadcast's rendezvous)


def server_hosts(plan_: Plan) -> dict[str, str]:
    """Where each server of a plan spanning nodes listens: its (first) node's address; a process
    beside the supervisor, the batch node's. {} when everything runs on the batch node (the
    config's hosts, loopback by default, then hold)."""
    if not plan_.spans_nodes():
        return {}
    out = {}
    for name, placed in plan_.placed.items():
        if placement.role_of(name) in SERVERS:
            out[name] = plan_.node(placed.nodes[0]).address if placed.shares else plan_.batch_node.address
    return out


def nodes_wanted(world: WorldConfig) -> list[Node]:
    """The nodes `rlrun submit` asks for, as placeholders (`node0`, ...) before SLURM names them."""
    return [Node(f"node{k}", f"node{k}", world.cpus_per_node, world.gpus_per_node) for k in range(world.nodes)]


def srun_argv(
    plan_: Plan,
    process: str,
    argv: list[str],
    *,
    job_id: str,
    record: Path,
    log: Path,
    srun_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The `srun` command that starts `process` (its spec's `argv`) as a step of job `job_id` on
    its planned nodes, one task per node, under the step wrapper (which writes `record` and execs
    `argv`, rewritten per node for ranks spanning nodes). The tasks write `log` themselves (not
    through srun, which stops relaying output when a cancel reaches it)."""
    placed = plan_.placed[process]
    if placed.local:
        raise ValueError(f"{process} runs beside the supervisor, not as a step")
    nodes = placed.nodes
    wrapper = [python, "-m", STEP_MODULE, "--record", str(record)]
    if len(placed.shares) > 1:
        layout = {
            "master_addr": plan_.node(nodes[0]).address,
            "world_size": placed.ranks,
            "nodes": {
                s.node: {"node_rank": s.node_rank, "first_rank": s.first_rank, "nproc": s.nproc, "gpus": list(s.gpus)}
                for s in placed.shares
            },
        }
        wrapper += ["--layout", json.dumps(layout, separators=(",", ":"))]
    elif placed.shares[0].gpus:
        wrapper += ["--gpus", ",".join(map(str, placed.shares[0].gpus))]
    return [
        "srun",
        f"--jobid={job_id}",
        f"--job-name={process}",
        "--overlap",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--input=none",
        f"--output={log}",
        "--open-mode=append",
        *srun_args,
        *wrapper,
        "--",
        *argv,
    ]


def cpus_per_node(value: str) -> list[int]:
    """SLURM_JOB_CPUS_PER_NODE ('72(x2),36') → [72, 72, 36]."""
    out = []
    for item in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ValueError(f"not a SLURM CPU count list: {value!r}")
        out += [int(match.group(1))] * int(match.group(2) or 1)
    return out


def node_addresses(scontrol_show_node: str) -> dict[str, str]:
    """`scontrol show node A,B` output → {node name: NodeAddr}."""
    found = {}
    for block in re.split(r"\n\s*\n", scontrol_show_node.strip()):
        name = re.search(r"NodeName=(\S+)", block)
        addr = re.search(r"NodeAddr=(\S+)", block)
        if name:
            found[name.group(1)] = addr.group(1) if addr else name.group(1)
    return found


def describe(plan_: Plan, process: str) -> tuple[str, str, str]:
    """(nodes, ranks, GPUs) of `process` for people: ('node2 (ranks 0-7), node3 (ranks 8-15)', ...)."""
    placed = plan_.placed[process]
    if placed.local:
        return f"{plan_.batch_node.name}, beside the supervisor (batch step; reserves nothing)", "-", "-"
    if placed.anchor:
        where = f"{placed.nodes[0]} (beside {placed.anchor})"
    else:
        where = ", ".join(placed.nodes)
    if placed.ranks > 1:
        ranks = "; ".join(
            f"{s.node}: {_span(s.first_rank, s.nproc)}"
            + (" (rendezvous)" if s.node_rank == 0 and len(placed.shares) > 1 else "")
            for s in placed.shares
        )
    else:
        ranks = "-"
    gpus = "; ".join(f"{s.node}: {','.join(map(str, s.gpus))}" for s in placed.shares if s.gpus) or "none"
    return where, ranks, gpus


def _span(first: int, n: int) -> str:
    return f"rank {first}" if n == 1 else f"ranks {first}-{first + n - 1}"
