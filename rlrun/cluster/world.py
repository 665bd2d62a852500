"""Which spawner a run's config asks for, and the names of the processes it places.

`spawner_for` gives a local spawner for world=local (the default) and a Ray spawner for
world=ray; Ray is imported only then.
"""

from __future__ import annotations

import hashlib

from rlrun.actor.partition import actor_name, ownership
from rlrun.backends import backend_for
from rlrun.cluster import placement
from rlrun.config import RunConfig
from rlrun.rundir import RunDir
from rlrun.supervisor.local import LocalSpawner, Spawner

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def process_names(cfg: RunConfig) -> list[str]:
    """The processes of a run, as `roles.build_specs` names them (a test holds the two together)."""
    names = [] if cfg.streams.url else ["redis"]
    names += [f"vllm-{i}" for i in range(cfg.inference.num_servers)]
    actors = [actor_name(k, cfg.actor.num_actors) for k in range(cfg.actor.num_actors)]
    return names + backend_for(cfg).roles(cfg) + actors


def run_tag(run_dir: RunDir) -> str:
    """A short name for the run in a shared cluster (its placement group, its agents)."""
    return hashlib.sha1(str(run_dir.root).encode()).hexdigest()[:10]


def spawner_for(cfg: RunConfig, run_dir: RunDir) -> Spawner:
    if cfg.world.kind == "local":
        return LocalSpawner()
    from rlrun.cluster.ray_world import RaySpawner

    loopback = cfg.inference.host in LOOPBACK or (cfg.streams.url is None and cfg.streams.host in LOOPBACK)
    return RaySpawner(
        cfg.world, placement.bundles(cfg.world, process_names(cfg), process_ranks(cfg)), run_tag(run_dir),
        same_machine_only=loopback, anchors=actor_anchors(cfg),
    )  # fmt: skip


def process_ranks(cfg: RunConfig) -> dict[str, int]:
    """The processes of several ranks: the trainer (its ranks all start on its node, as one
    supervised group), with world.trainer.cpus/gpus per rank."""
    return {"trainer": backend_for(cfg).trainer_ranks(cfg)}


def placement_rows(cfg: RunConfig) -> list[tuple[str, str, str, str]]:
    """What `--dry-run` shows under world=ray, per process: (name, ranks, the bundle reserved,
    where it runs). Pure: no Ray."""
    ranks = process_ranks(cfg)
    per_process = placement.bundles(cfg.world, process_names(cfg), ranks)
    anchors = actor_anchors(cfg)
    rows = []
    for name, bundle in per_process.items():
        n = ranks.get(name, 1)
        if not bundle:
            where = "this machine, beside the supervisor (not placed by Ray)"
        elif anchors.get(name) and per_process.get(anchors[name]):
            where = f"the node of {anchors[name]} (one bundle with it)"
        else:
            where = "a node Ray picks for this bundle" + (f"; all {n} ranks on it" if n > 1 else "")
        shown = ", ".join(f"rank {r}" for r in range(n)) if n > 1 else "-"
        role = getattr(cfg.world, placement.role_of(name)).bundle()
        per_rank = placement.describe({k: v for k, v in role.items() if k in placement.PER_RANK})
        rows.append((name, shown, placement.describe(bundle) + (f" ({per_rank} per rank)" if n > 1 and bundle else ""), where))
    return rows


def actor_anchors(cfg: RunConfig) -> dict[str, str]:
    """Each actor → its first vLLM server, whose node it shares under world=ray (its requests and
    token stream stay on one machine)."""
    return {actor: servers[0] for actor, servers in ownership(cfg.actor.num_actors, cfg.inference.num_servers).items()}
