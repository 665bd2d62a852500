"""Placement as plain data: which Ray resources each process reserves, and what a cluster lacks.

Pure functions over dicts (no Ray): the resources one process of each role asks for (its bundle
in the run's placement group), and, given what the cluster's nodes offer, the list of what is
missing, worded for a person.
"""

from __future__ import annotations

from rlrun.config.schema import WorldConfig

ROLES = ("redis", "vllm", "trainer", "actor")
# Light companion processes, placed like the role named (the Fast-LLM weight follower talks to
# the vLLM servers' admin routes, as the actor talks to their completions).
PLACED_LIKE = {"weights": "actor"}
# Resources every Ray node reports that nobody asks for by hand: left out of messages.
BOOKKEEPING = ("memory", "object_store_memory")


def role_of(process: str) -> str:
    """'vllm-0' → 'vllm'; 'trainer' → 'trainer'."""
    role = process.rsplit("-", 1)[0] if process.rsplit("-", 1)[-1].isdigit() else process
    role = PLACED_LIKE.get(role, role)
    if role not in ROLES:
        raise ValueError(f"no placement for process {process!r}: roles are {', '.join(ROLES)}")
    return role


# Per-rank resources: a process of N ranks reserves N times these. Custom resources pick nodes
# (a node offering {trainer_node: 1}), so they are asked for once, not per rank.
PER_RANK = ("CPU", "GPU")


def bundles(world: WorldConfig, processes: list[str], ranks: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Per process, in start order, the resources it reserves; {} for one that runs locally.
    `ranks`: process → its ranks (the trainer's nproc_per_node), whose bundle is `rank_bundle`."""
    ranks = ranks or {}
    return {name: rank_bundle(getattr(world, role_of(name)).bundle(), ranks.get(name, 1)) for name in processes}


def rank_bundle(per_rank: dict[str, float], ranks: int) -> dict[str, float]:
    """One bundle for a process of `ranks` ranks on one node (the rank group starts them all
    there): CPUs and GPUs once per rank, custom resources (node pickers) once."""
    return {name: amount * ranks if name in PER_RANK else amount for name, amount in per_rank.items()}


def describe(resources: dict[str, float]) -> str:
    """{'GPU': 1.0, 'vllm_node': 1.0} → 'GPU 1, vllm_node 1'."""
    shown = {k: v for k, v in resources.items() if k not in BOOKKEEPING and not k.startswith("node:")}
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(shown.items())) or "nothing"


def fits(bundle: dict[str, float], offer: dict[str, float]) -> bool:
    return all(offer.get(name, 0.0) >= amount for name, amount in bundle.items())


def shortfall(wanted: dict[str, dict[str, float]], nodes: dict[str, dict[str, float]]) -> list[str]:
    """What the cluster can never give `wanted` (process → bundle; {} bundles are ignored).

    `nodes`: the total resources of each alive node (by a label such as its address and id).
    Each bundle must fit on one node, and their sum in the whole cluster. What other jobs hold
    right now is not counted (it may be released): an empty list is no promise that the bundles
    will be reserved, but every line it returns is a reason they never can be.
    """
    problems = []
    placed = {name: bundle for name, bundle in wanted.items() if bundle}
    for name, bundle in placed.items():
        if not any(fits(bundle, offer) for offer in nodes.values()):
            problems.append(f"{name} needs {describe(bundle)} on one node, and no node has that")
    totals: dict[str, float] = {}
    for bundle in placed.values():
        for resource, amount in bundle.items():
            totals[resource] = totals.get(resource, 0.0) + amount
    for resource, amount in sorted(totals.items()):
        have = sum(offer.get(resource, 0.0) for offer in nodes.values())
        if have < amount:
            users = ", ".join(name for name, bundle in placed.items() if resource in bundle)
            problems.append(f"{resource}: {amount:g} needed in all ({users}), the cluster has {have:g}")
    return problems


def describe_nodes(nodes: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{label}: {describe(offer)}" for label, offer in nodes.items()) or "no node alive"


def colocate(bundles: dict[str, dict[str, float]], anchors: dict[str, str]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Bundles merged so that a process runs on the node of its anchor (actor k next to its first
    vLLM server): the anchored process's resources are added to its anchor's bundle, and it takes
    that bundle's node. Only where both are placed by Ray (a local one has no bundle to share).

    Returns (the bundles to reserve, by owning process, in start order; process → the process
    whose bundle it runs in, for every placed process, itself when not anchored).
    """
    joined = {name: anchor for name, anchor in anchors.items() if bundles.get(name) and bundles.get(anchor) and name != anchor}
    reserved: dict[str, dict[str, float]] = {}
    for name, bundle in bundles.items():
        if bundle and name not in joined:
            reserved[name] = dict(bundle)
    for name, anchor in joined.items():
        for resource, amount in bundles[name].items():
            reserved[anchor][resource] = reserved[anchor].get(resource, 0.0) + amount
    owner = {name: joined.get(name, name) for name, bundle in bundles.items() if bundle}
    return reserved, owner
