"""The run's plan, built once: every process `rlrun train` starts (command, environment, log, GPUs),
the CPU cores and sockets they take, where each goes (Ray bundles, SLURM nodes and srun steps) and
the model they load. `--dry-run` renders a `RunPlan`; `launch.train` starts its processes.

Ports are 0 in the plan: the launch picks them free at each start and rebuilds the same processes
on them (`RunPlan.specs_on`), since a port can be lost to another program between two starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Optional

from rlrun.actor.partition import ownership
from rlrun.cluster import slurm_plan
from rlrun.cluster.gpus import NOT_PLACED, GpuPlan, find_visible
from rlrun.errors import ConfigError
from rlrun.inference.server import base_url
from rlrun.models.source import model_path
from rlrun.parts import sockets
from rlrun.parts.role_parts import Endpoints
from rlrun.run.built import BuiltRun
from rlrun.run.roles import build_specs
from rlrun.rundir import RunDir
from rlrun.streams import server as redis_server
from rlrun.supervisor import EventLog, ProcessSpec


@dataclass(frozen=True)
class SlurmSteps:
    """world=slurm: the nodes the run is planned on and the srun step of each process."""

    where: str  # which nodes, in words
    batch_script: Optional[str]  # outside a job: what `rlrun submit` would sbatch
    plan: slurm_plan.Plan  # each process's node, ranks and GPUs
    steps: dict[str, list[str]]  # srun argv of each process not started in the batch step


@dataclass(frozen=True)
class RunPlan:
    """What a run starts and where; built before anything starts, changed by nothing after."""

    built: BuiltRun
    run_dir: RunDir
    model_path: str  # the folder (or hub id) vLLM and the trainer load
    gpus: GpuPlan  # world=local: the GPUs of each process
    specs: tuple[ProcessSpec, ...]  # in start order, on port 0
    sockets: tuple[sockets.Listener, ...]  # every socket the run listens on
    cores: dict[str, tuple[int, ...]]  # world=local: each process's CPU cores ("": the others)
    actors: dict[str, list[str]]  # each actor → the vLLM servers it sends to
    placement: tuple[tuple[str, str, str, str], ...]  # world=ray: (process, ranks, bundle, node)
    slurm: Optional[SlurmSteps]  # world=slurm, previewed by a dry run

    def specs_on(self, endpoints: Endpoints, events: EventLog) -> list[ProcessSpec]:
        """The plan's processes on the ports a launch picked, their hooks recording into `events`."""
        return build_specs(self.built, self.run_dir, endpoints, self.model_path, events, self.gpus)


def build_plan(built: BuiltRun, run_dir: RunDir, gpus: Optional[GpuPlan] = None, preview: bool = False) -> RunPlan:
    """The plan of `built` in `run_dir`. `gpus`: default, this machine's plan (`gpu_plan`).
    `preview` (a dry run): nothing is built (the model's folder is named, not made), a GPU run is
    shown on a machine without GPUs, and world=slurm's nodes and srun steps are previewed (a launch
    leaves those to the spawner, on the allocation it finds)."""
    cfg, backend = built.cfg, built.backend
    path = model_path(cfg.model, build=not preview, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand)
    gpus = gpu_plan(built, preview=preview) if gpus is None else gpus
    specs = build_specs(built, run_dir, plan_endpoints(built, pick_port=lambda host: 0), path, EventLog(None), gpus)
    slurm = _slurm_steps(built, run_dir, specs, os.environ) if preview and cfg.world.kind == "slurm" else None
    return RunPlan(
        built=built,
        run_dir=run_dir,
        model_path=path,
        gpus=gpus,
        specs=tuple(specs),
        sockets=tuple(sockets.planned(cfg.streams, cfg.inference, backend.redis_default_user(), backend.listeners())),
        cores=_local_cores(built),
        actors=ownership(cfg.actor.num_actors, cfg.inference.num_servers),
        placement=tuple(built.world.placement_rows()) if cfg.world.kind == "ray" else (),
        slurm=slurm,
    )


def plan_endpoints(
    built: BuiltRun, pick_port: Callable[[str], int], hosts: Optional[dict[str, str]] = None
) -> Endpoints:
    """Ports picked free here (on inference.host / streams.host); `hosts`: the servers that listen
    on another address (their node's: `Spawner.server_hosts`), which their URLs then name."""
    cfg, hosts = built.cfg, dict(hosts or {})
    if cfg.streams.url:
        from rlrun.streams.external import process_url

        redis_url, redis_port = process_url(cfg.streams.url, cfg.streams.password_file is not None), None
    else:
        redis_port = pick_port(cfg.streams.host)
        redis_url = redis_server.redis_url(hosts.get("redis", cfg.streams.host), redis_port)
    vllm_urls = [
        base_url(hosts.get(f"vllm-{i}", cfg.inference.host), pick_port(cfg.inference.host))
        for i in range(cfg.inference.num_servers)
    ]
    broadcast_port = built.backend.broadcast_port(pick_port)
    return Endpoints(
        redis_url=redis_url, redis_port=redis_port, vllm_urls=vllm_urls, broadcast_port=broadcast_port, hosts=hosts
    )


def gpu_plan(built: BuiltRun, environ: Optional[Mapping[str, str]] = None, preview: bool = False) -> GpuPlan:
    """The GPUs of each process on this machine (world=local; `rlrun/cluster/gpus.py`), found from
    `environ` (default: ours) or NVML. ConfigError when the run asks for more than it shows;
    `preview` (a dry run) on a machine that shows none: not placed, not refused (a GPU run previewed
    on a laptop)."""
    if built.cfg.world.kind != "local":
        return NOT_PLACED
    visible = find_visible(os.environ if environ is None else environ)
    if preview and not visible.ids:
        return GpuPlan(visible)
    return built.world.gpu_plan(visible)


def _local_cores(built: BuiltRun) -> dict[str, tuple[int, ...]]:
    if built.cfg.world.kind != "local":
        return {}
    from rlrun.cluster.world import local_cores

    return local_cores(built.cfg)


def _slurm_steps(built: BuiltRun, run_dir: RunDir, specs: list[ProcessSpec], environ: Mapping[str, str]) -> SlurmSteps:
    """Inside a job: its nodes. Outside: the nodes the batch script asks for, named node0.. until
    SLURM names them. ConfigError when the run does not fit them."""
    from rlrun.cluster import slurm_job
    from rlrun.cluster.world import allocation_nodes

    cfg = built.cfg
    job = slurm_job.JobEnv.from_env(environ)
    script = None
    if job is None:
        nodes = slurm_plan.nodes_wanted(cfg.world)
        where = f"the {cfg.world.nodes} node(s) the job asks for, named node0.. until SLURM names them; node0 runs the batch step"
        script = slurm_job.batch_script(
            cfg.world, run_dir.root, f"rlrun-{run_dir.root.name}", sys.executable, run_dir.slurm / "job-%j.out"
        )
    else:
        nodes = allocation_nodes(cfg, job, environ.get("SLURMD_NODENAME"))
        where = f"the nodes of SLURM job {job.job_id}"
    try:
        plan = built.world.slurm_plan(nodes)
    except slurm_plan.DoesNotFit as exc:
        raise ConfigError(
            f"the run does not fit {where}: {exc}. Change world.nodes, world.gpus_per_node or world.<role>.gpus/cpus."
        ) from None
    by_name = {spec.name: spec for spec in specs}
    steps = {
        name: slurm_plan.srun_argv(
            plan,
            name,
            by_name[name].argv,
            job_id=job.job_id if job else "$SLURM_JOB_ID",
            record=run_dir.slurm_steps / f"{name}.<id>.json",
            log=by_name[name].log_path,
            srun_args=list(cfg.world.srun_args),
        )
        for name, placed in plan.placed.items()
        if not placed.local
    }
    return SlurmSteps(where, script, plan, steps)
