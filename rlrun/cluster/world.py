"""The world a run's processes are placed in: `World`, built once per run (rlrun/run/built.py)
from its config and what its trainer backend says of its processes; the spawner it asks for (Ray
imported only for world=ray), and the names and bundles of the processes it places.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlrun.actor.partition import ownership
from rlrun.cluster import gpus, placement
from rlrun.cluster.cores import cores_by_process
from rlrun.config import RunConfig
from rlrun.listen import LOOPBACK
from rlrun.rundir import RunDir
from rlrun.streams.names import actor_name
from rlrun.supervisor.local import LocalSpawner, Spawner

if TYPE_CHECKING:
    from rlrun.cluster.slurm_plan import Plan as SlurmPlan


@dataclass(frozen=True)
class World:
    """Where the processes of a run of `cfg` go. The trainer's part is its backend's answer,
    taken once: its processes, its ranks, whether they may span nodes."""

    cfg: RunConfig
    trainer_roles: tuple[str, ...]  # the trainer backend's processes, in start order
    trainer_ranks: int  # world=ray/slurm reserve world.trainer.cpus/gpus per rank
    ranks_span_nodes: bool  # its ranks may run on several nodes, one bundle each

    def process_names(self) -> list[str]:
        """The processes of a run, as `roles.build_specs` names them (a test holds the two together)."""
        cfg = self.cfg
        names = [] if cfg.streams.url else ["redis"]
        names += [f"vllm-{i}" for i in range(cfg.inference.num_servers)]
        actors = [actor_name(k, cfg.actor.num_actors) for k in range(cfg.actor.num_actors)]
        return names + list(self.trainer_roles) + actors

    def process_ranks(self) -> dict[str, int]:
        return {"trainer": self.trainer_ranks}

    def spread_processes(self) -> frozenset[str]:
        """The processes whose ranks may run on several nodes, one bundle per rank: the trainer when
        its backend starts its ranks as rlrun's rank group (hf); Fast-LLM's torchrun keeps them on one."""
        return frozenset({"trainer"}) if self.ranks_span_nodes else frozenset()

    def bundles(self) -> dict[str, list[placement.Bundle]]:
        return placement.bundles(self.cfg.world, self.process_names(), self.process_ranks(), self.spread_processes())

    def spawner(self, run_dir: RunDir) -> Spawner:
        """The spawner world.kind asks for (one per launch: a retry keeps its placement)."""
        cfg = self.cfg
        if cfg.world.kind == "local":
            return LocalSpawner(local_cores(cfg))
        if cfg.world.kind == "slurm":
            return slurm_spawner(self, run_dir)
        from rlrun.cluster.ray_world import RaySpawner

        loopback = cfg.inference.host in LOOPBACK or (cfg.streams.url is None and cfg.streams.host in LOOPBACK)
        return RaySpawner(
            cfg.world, self.bundles(), run_tag(run_dir), same_machine_only=loopback, anchors=actor_anchors(cfg)
        )

    def placement_rows(self) -> list[tuple[str, str, str, str]]:
        """What `--dry-run` shows under world=ray, per process (per rank for a trainer whose ranks have
        a bundle each): (name, ranks, the bundle reserved, where it runs). Pure: Ray is not asked, so
        the node is the placement's choice."""
        cfg = self.cfg
        ranks = self.process_ranks()
        anchors = actor_anchors(cfg)
        per_process = self.bundles()
        rows = []
        for name, owned in per_process.items():
            n = ranks.get(name, 1)
            if not owned:
                rows.append((name, "-", "nothing", "this machine, beside the supervisor (not placed by Ray)"))
            elif anchors.get(name) and per_process.get(anchors[name]):
                rows.append(
                    (name, "-", placement.describe(owned[0]), f"the node of {anchors[name]} (one bundle with it)")
                )
            elif len(owned) > 1:  # one bundle per rank
                for rank, bundle in enumerate(owned):
                    where = "a node Ray picks for this rank's bundle" + (
                        " (rank 0's node: the ranks' rendezvous)"
                        if rank == 0
                        else "; with the other ranks on that node, one rank group"
                    )
                    rows.append((name, f"rank {rank}", placement.describe(bundle), where))
            elif n > 1:
                per_rank = placement.describe(
                    {
                        k: v
                        for k, v in getattr(cfg.world, placement.role_of(name)).bundle().items()
                        if k in placement.PER_RANK
                    }
                )
                shown = ", ".join(f"rank {r}" for r in range(n))
                rows.append(
                    (
                        name,
                        shown,
                        f"{placement.describe(owned[0])} ({per_rank} per rank)",
                        f"a node Ray picks for this bundle; all {n} ranks on it",
                    )
                )
            else:
                rows.append((name, "-", placement.describe(owned[0]), "a node Ray picks for this bundle"))
        return rows

    def gpu_plan(self, visible: gpus.Visible) -> gpus.GpuPlan:
        """world=local: the GPUs of each process among the `visible` ones (`gpus.plan`); ConfigError
        when the run asks for more. Other worlds place GPUs themselves: nothing narrowed here."""
        cfg = self.cfg
        if cfg.world.kind != "local":
            return gpus.NOT_PLACED
        return gpus.plan(
            visible,
            self.process_names(),
            self.process_ranks(),
            actor_anchors(cfg),
            tensor_parallel=cfg.inference.tensor_parallel_size,
            trainer_device=cfg.trainer.device,
            share=cfg.world.share_gpus,
        )

    def vllm_gpu_use(self, plan: gpus.GpuPlan, process: str) -> gpus.GpuUse:
        """What a server's GPUs are (its memory default follows): the local plan's word, or
        world.vllm.gpus where Ray or SLURM places it."""
        if self.cfg.world.kind == "local":
            return plan.use(process)
        return "own" if self.cfg.world.vllm.gpus > 0 else "cpu"

    def slurm_plan(self, nodes: list) -> SlurmPlan:
        """world=slurm: where each process of the run goes on `nodes` (slurm_plan.Node, batch node
        first); slurm_plan.DoesNotFit when they cannot hold it."""
        from rlrun.cluster import slurm_plan

        return slurm_plan.plan(
            self.cfg.world,
            self.process_names(),
            self.process_ranks(),
            self.spread_processes(),
            actor_anchors(self.cfg),
            nodes,
        )


def run_tag(run_dir: RunDir) -> str:
    """A short name for the run in a shared cluster (its placement group, its agents)."""
    return hashlib.sha1(str(run_dir.root).encode()).hexdigest()[:10]


def local_cores(cfg: RunConfig, available: set[int] | None = None) -> dict[str, tuple[int, ...]]:
    """world=local: the cores of each process (`rlrun/cluster/cores.py`); {} with world.cpu_affinity=none.
    `available`: the cores rlrun itself may use (default: asked of the OS)."""
    import os

    if cfg.world.cpu_affinity == "none":
        return {}
    servers = [f"vllm-{i}" for i in range(cfg.inference.num_servers)]
    cores = os.sched_getaffinity(0) if available is None else available
    split = cores_by_process(cores, servers, cfg.inference.threads)
    if split and cfg.world.cpu_affinity == "by_need":  # the trainer also takes the servers' cores while they idle
        split["trainer"] = tuple(sorted(cores))
    return split


def actor_anchors(cfg: RunConfig) -> dict[str, str]:
    """Each actor → its first vLLM server, whose node it shares under world=ray (its requests and
    token stream stay on one machine)."""
    return {actor: servers[0] for actor, servers in ownership(cfg.actor.num_actors, cfg.inference.num_servers).items()}


def allocation_nodes(cfg: RunConfig, job, batch_node: str | None) -> list:
    """The nodes of the SLURM job this process runs in (`slurm_job.JobEnv`), the batch node first,
    with the CPUs the job has on each and world.gpus_per_node GPUs."""
    from rlrun.cluster import slurm_job, slurm_plan

    names = slurm_job.expand_nodelist(job.nodelist)
    try:
        cpus = dict(zip(names, slurm_plan.cpus_per_node(job.cpus_per_node)))
    except ValueError:
        cpus = {}
    addresses = {name: _ip(address) for name, address in slurm_job.node_addresses(names).items()}
    if batch_node in names:
        names = [batch_node] + [n for n in names if n != batch_node]
    return [slurm_plan.Node(n, addresses[n], cpus.get(n), cfg.world.gpus_per_node) for n in names]


def slurm_spawner(world: World, run_dir: RunDir) -> Spawner:
    """world=slurm inside the job's allocation: its nodes asked of SLURM, the run planned on them."""
    import os

    from rlrun.cluster import slurm_job, slurm_plan
    from rlrun.cluster.slurm_world import SlurmSpawner
    from rlrun.errors import EnvironmentProblem

    cfg = world.cfg
    job = slurm_job.JobEnv.from_env(os.environ)  # the allocation is the world this run finds itself in
    if job is None:
        raise EnvironmentProblem(
            "world=slurm runs inside a SLURM job: submit the run with `rlrun submit world=slurm ...` (or start it "
            "within `salloc`)."
        )
    nodes = allocation_nodes(cfg, job, os.environ.get("SLURMD_NODENAME"))
    try:
        plan = world.slurm_plan(nodes)
    except slurm_plan.DoesNotFit as exc:
        raise EnvironmentProblem(
            f"the SLURM job {job.job_id} cannot hold this run: {exc}. Ask for more nodes or GPUs (world.nodes, "
            f"world.gpus_per_node) or less per role (world.<role>.cpus, world.<role>.gpus)."
        ) from None
    return SlurmSpawner(
        plan,
        job.job_id,
        run_dir.slurm_steps,
        srun_args=list(cfg.world.srun_args),
        start_timeout_s=cfg.world.placement_timeout_s,
    )


def _ip(address: str) -> str:
    """A node's address as an IP (Redis binds IPs), when the name resolves here."""
    import socket

    try:
        return socket.gethostbyname(address)
    except OSError:
        return address
