"""The run, built once: its typed config, the trainer backend bound to it, and the world its
processes are placed in. `build(cfg)` is the one place the backend is looked up (`rlrun.backends`);
everything after it (preflight, the specs, the supervisor's completion check, the dry run, the
offline commands) is handed the `BuiltRun` or its bound backend, and asks nothing again.

    built = build(cfg)
    built.backend.specs(run_dir, endpoints, model_path, probe, events)
    built.world.spawner(run_dir)
"""

from __future__ import annotations

from dataclasses import dataclass

from rlrun.backends import TrainerBackend, backend_for
from rlrun.cluster.world import World
from rlrun.config import RunConfig


@dataclass(frozen=True)
class BuiltRun:
    cfg: RunConfig
    backend: TrainerBackend  # bound to cfg
    world: World  # where its processes go (world.kind's spawner, Ray bundles, SLURM plan)


def build(cfg: RunConfig) -> BuiltRun:
    """The run of `cfg`: its backend resolved and bound, its world built from what that backend
    says of its processes. Pure: starts nothing, reads nothing."""
    backend = backend_for(cfg)
    world = World(cfg, tuple(backend.roles()), backend.trainer_ranks(), backend.ranks_span_nodes)
    return BuiltRun(cfg, backend, world)
