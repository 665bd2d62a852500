"""What the `auto` settings become for a run: a pure function of its config, applied wherever a
config is loaded (`compose.config_from_data`), so every process of a run makes the same choice.

- `world.cpu_affinity=auto`: `by_need` where it applies (world=local, one hf trainer rank on CPU:
  the trainer also runs on the servers' cores while no request is in flight), `split` elsewhere.
- `trainer.weight_transfer=auto`: `shm` where it applies (world=local, an hf trainer on CPU: the
  servers on the trainer's host map one file), `disk` elsewhere.

Why these are the defaults (bench/README.md, "vs_trl.py recipe=smollm2_grpo"): on 2 cores with
SmolLM2-135M, by_need and shm took rlrun's time to reward 0.8 from 0.89 to 0.71 of TRL's and its
weight update from 1.27 s to 0.60 s. GPU trainers keep disk and split until measured on a GPU.
"""

from __future__ import annotations

import dataclasses

from rlrun.config.schema import RunConfig, TrainerConfig, WorldConfig


def lends_servers_cores(world: WorldConfig, trainer: TrainerConfig) -> bool:
    """world.cpu_affinity=by_need can apply: one hf trainer rank on CPU beside local servers."""
    return world.kind == "local" and trainer.backend == "hf" and trainer.nproc_per_node == 1 and trainer.device == "cpu"


def shares_memory_with_servers(world: WorldConfig, trainer: TrainerConfig) -> bool:
    """trainer.weight_transfer=shm is auto's choice: an hf trainer on CPU, the servers on its host."""
    return world.kind == "local" and trainer.backend == "hf" and trainer.device == "cpu"


def resolve_auto(cfg: RunConfig) -> RunConfig:
    """`cfg` with world.cpu_affinity and trainer.weight_transfer `auto` replaced by their choice."""
    world, trainer = cfg.world, cfg.trainer
    if world.cpu_affinity == "auto":
        world = dataclasses.replace(world, cpu_affinity="by_need" if lends_servers_cores(world, trainer) else "split")
    if trainer.weight_transfer == "auto":
        shm = shares_memory_with_servers(cfg.world, trainer)
        trainer = dataclasses.replace(trainer, weight_transfer="shm" if shm else "disk")
    return dataclasses.replace(cfg, world=world, trainer=trainer)
