"""Placement as plain data (no Ray): the bundles each process reserves, which ranks run on which
node, and what a cluster lacks, worded for a person.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rlrun.config.schema import WorldConfig

ROLES = ("redis", "vllm", "trainer", "actor")
# Light companion processes, placed like the role named (the Fast-LLM weight follower talks to
# the vLLM servers' admin routes, as the actor talks to their completions).
PLACED_LIKE = {"weights": "actor"}
# Resources every Ray node reports that nobody asks for by hand: left out of messages.
BOOKKEEPING = ("memory", "object_store_memory")
# Per-rank resources: a process of N ranks on one node reserves N times these. Custom resources
# pick nodes (a node offering {trainer_node: 1}), so such a bundle asks for them once.
PER_RANK = ("CPU", "GPU")

Bundle = dict[str, float]


def role_of(process: str) -> str:
    """'vllm-0' → 'vllm'; 'trainer' → 'trainer'."""
    role = process.rsplit("-", 1)[0] if process.rsplit("-", 1)[-1].isdigit() else process
    role = PLACED_LIKE.get(role, role)
    if role not in ROLES:
        raise ValueError(f"no placement for process {process!r}: roles are {', '.join(ROLES)}")
    return role


def bundles(
    world: WorldConfig, processes: list[str], ranks: dict[str, int] | None = None, spread: frozenset[str] = frozenset()
) -> dict[str, list[Bundle]]:
    """Per process, in start order, its bundles: [] to run locally, else one; a process of N ranks
    (`ranks`) gets N bundles of `world.<role>` when in `spread` (its ranks may run on several
    nodes), else one for all its ranks on one node (`rank_bundle`: Fast-LLM's torchrun)."""
    ranks = ranks or {}
    out: dict[str, list[Bundle]] = {}
    for name in processes:
        one, n = getattr(world, role_of(name)).bundle(), ranks.get(name, 1)
        if not one:
            out[name] = []
        elif name in spread:
            out[name] = [dict(one) for _ in range(n)]
        else:
            out[name] = [rank_bundle(one, n)]
    return out


def rank_bundle(per_rank: Bundle, ranks: int) -> Bundle:
    """One bundle for a process of `ranks` ranks on one node: CPUs and GPUs once per rank, custom
    resources (node pickers) once."""
    return {name: amount * ranks if name in PER_RANK else amount for name, amount in per_rank.items()}


@dataclass(frozen=True)
class NodeRanks:
    """The ranks of a spread process that run on one node, as one rank group there."""

    node: str  # the node's id
    node_rank: int  # torchrun's GROUP_RANK: 0 is the node of rank 0, whose address is the rendezvous
    first_rank: int  # its ranks are first_rank .. first_rank + nproc - 1 (contiguous: LOCAL_RANK + first_rank)
    nproc: int


def node_ranks(bundle_nodes: list[str]) -> list[NodeRanks]:
    """Which ranks run on which node, given the node each rank's bundle landed on (in bundle order):
    numbered per node, contiguously, nodes in order of first appearance (A, B, A: A 0-1, B 2)."""
    out, first = [], 0
    for k, (node, n) in enumerate(Counter(bundle_nodes).items()):
        out.append(NodeRanks(node, k, first, n))
        first += n
    return out


def describe(resources: Bundle) -> str:
    """{'GPU': 1.0, 'vllm_node': 1.0} → 'GPU 1, vllm_node 1'."""
    shown = {k: v for k, v in resources.items() if k not in BOOKKEEPING and not k.startswith("node:")}
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(shown.items())) or "nothing"


def describe_bundles(bundles: list[Bundle]) -> str:
    """[b] → 'CPU 1'; [b, b] → '2 bundles of CPU 1 (one per rank)'."""
    if len(bundles) > 1 and all(b == bundles[0] for b in bundles):
        return f"{len(bundles)} bundles of {describe(bundles[0])} (one per rank)"
    return "; ".join(describe(b) for b in bundles) or "nothing"


def shortfall(wanted: dict[str, list[Bundle]], nodes: dict[str, Bundle]) -> list[str]:
    """What the cluster can never give `wanted` (process → its bundles), given the total resources
    of each alive node: each bundle must fit on one node, their sum in the cluster. What other jobs
    hold now is not counted: [] is no promise, but every line is a reason they never can be."""
    problems = []
    placed = {name: bs for name, bs in wanted.items() if bs}
    for name, bs in placed.items():
        for bundle in {tuple(sorted(b.items())): b for b in bs}.values():  # each distinct one once
            fits = [all(offer.get(r, 0.0) >= n for r, n in bundle.items()) for offer in nodes.values()]
            if not any(fits):
                each = f" for each of its {len(bs)} ranks" if len(bs) > 1 else ""
                problems.append(f"{name} needs {describe(bundle)} on one node{each}, and no node has that")
    totals: Counter = Counter()
    for bs in placed.values():
        for bundle in bs:
            totals.update(bundle)
    for resource, amount in sorted(totals.items()):
        have = sum(offer.get(resource, 0.0) for offer in nodes.values())
        if have < amount:
            users = ", ".join(
                name + (f": {len(bs)} ranks" if len(bs) > 1 else "")
                for name, bs in placed.items()
                if any(resource in b for b in bs)
            )
            problems.append(f"{resource}: {amount:g} needed in all ({users}), the cluster has {have:g}")
    return problems


def describe_nodes(nodes: dict[str, Bundle]) -> str:
    return "; ".join(f"{label}: {describe(offer)}" for label, offer in nodes.items()) or "no node alive"


def colocate(
    bundles: dict[str, list[Bundle]], anchors: dict[str, str]
) -> tuple[dict[str, list[Bundle]], dict[str, str]]:
    """Bundles merged so that a process runs on its anchor's node (actor k next to its first vLLM
    server): its resources added to the anchor's bundle, where both have exactly one. Returns (the
    bundles to reserve by owning process, in start order; placed process → the bundle's owner)."""
    joined = {
        name: anchor
        for name, anchor in anchors.items()
        if name != anchor and len(bundles.get(name, ())) == 1 and len(bundles.get(anchor, ())) == 1
    }
    reserved: dict[str, list[Bundle]] = {}
    for name, bs in bundles.items():
        if bs and name not in joined:
            reserved[name] = [dict(b) for b in bs]
    for name, anchor in joined.items():
        for resource, amount in bundles[name][0].items():
            reserved[anchor][0][resource] = reserved[anchor][0].get(resource, 0.0) + amount
    owner = {name: joined.get(name, name) for name, bs in bundles.items() if bs}
    return reserved, owner
