"""world=ray: the run's process specs on the nodes of an existing Ray cluster (docs/cluster.md).

    spawner = RaySpawner(cfg.world, placement.bundles(cfg.world, names, ranks, spread), run_tag)
    Supervisor(specs, events, spawner=spawner)   # same restart policy, completion rule, journal

Owns: the one placement group reserved at the first spawn (a cluster too small is reported before
anything starts), one node agent per node that starts, polls and signals the placed processes, and
a trainer whose ranks landed on several nodes as one `SpreadHandle` with torchrun's semantics. A
process with no bundle runs here through the local spawner. Refuses: restart decisions (the
supervisor's), secrets on a command line (`secret_env` is read here and sent with the start call).
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from typing import Any, Optional

from rlrun.cluster import placement
from rlrun.cluster.agent import NodeAgent
from rlrun.config.schema import WorldConfig
from rlrun.errors import EnvironmentProblem
from rlrun.supervisor.local import Handle, LocalSpawner, Spawner
from rlrun.supervisor.spec import ProcessSpec
from rlrun.trainer import rank_group

log = logging.getLogger(__name__)

NAMESPACE = "rlrun"
CALL_TIMEOUT_S = 10.0  # an agent that does not answer a call this long: "no news" for this poll
START_TIMEOUT_S = 30.0  # the same for a call that starts or finds something
START_HINT = (
    "Start a cluster with `ray start --head --port=6379` on the head node and "
    "`ray start --address=HEAD_IP:6379` on every other node (rlrun runs on one of them), "
    "or point world.address at a running one."
)


def _ray():
    try:
        import ray
    except ImportError:
        raise EnvironmentProblem("world=ray needs Ray in this environment: pip install 'rlrun[ray]'.") from None
    return ray


def connect(address: str) -> None:
    """Join the Ray cluster at `address` as its driver (once per process); EnvironmentProblem
    naming the address and how to start a cluster when there is none."""
    ray = _ray()
    if ray.is_initialized():
        return
    if address != "auto":
        _check_reachable(address)
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise EnvironmentProblem(f"no Ray cluster at world.address={address} ({exc}). {START_HINT}") from None
    except (RuntimeError, ValueError) as exc:  # e.g. the cluster runs another Ray version
        raise EnvironmentProblem(f"cannot join the Ray cluster at world.address={address}: {exc}") from None


def _check_reachable(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EnvironmentProblem(f"world.address={address} is not HOST:PORT (nor auto). {START_HINT}")
    try:
        socket.create_connection((host, int(port)), timeout=3.0).close()
    except OSError as exc:
        raise EnvironmentProblem(
            f"no Ray cluster at world.address={address}: nothing answers there ({exc.strerror or exc}). {START_HINT}"
        ) from None
    try:  # Ray dials another address than the one given for loopback hosts: say so, not hang
        from ray._private.services import canonicalize_bootstrap_address

        dialled = canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - a private helper: without it, just connect
        return
    if dialled and dialled != address:
        d_host, _, d_port = dialled.rpartition(":")
        try:
            socket.create_connection((d_host, int(d_port)), timeout=3.0).close()
        except OSError:
            raise EnvironmentProblem(
                f"world.address={address}: Ray would connect to {dialled} instead (it rewrites loopback "
                f"addresses to this machine's), where nothing answers. For a cluster bound to loopback, "
                f"run rlrun with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in its environment; otherwise give "
                f"the head's real address."
            ) from None


class RayHandle:
    def __init__(self, agent, pid: int, node_id: str, name: str) -> None:
        self.pid = pid  # the guard's pid on its node (it leads the process group)
        self.node_id = node_id
        self._agent, self._name = agent, name
        self.lost = False  # its agent is gone: the guard has killed the group

    def poll(self) -> Optional[int]:
        if not self.lost:
            answered, code = self._call(self._agent.poll.remote(self.pid))
            if answered:
                return code
        return -signal.SIGKILL if self.lost else None

    def signal_group(self, sig: int) -> None:
        if self.lost:
            return
        answered, _ = self._call(self._agent.signal_group.remote(self.pid, sig))
        if not answered and sig == signal.SIGKILL and not self.lost:
            # An agent that cannot even be reached to kill its process is taken as gone: its guards
            # kill their groups when Ray declares the node dead, and the agent with it.
            log.warning("the node agent of %s (node %s) does not answer: taken as lost", self._name, self.node_id[:12])
            self.lost = True

    def descendants(self, fresh: bool = False) -> list[int]:
        return []  # recorded and swept by the agent on the process's own node (see the module doc)

    def _call(self, ref) -> tuple[bool, Any]:
        """(answered, value) of an agent call; no answer in time is no news, a dead agent is lost."""
        ray = _ray()
        try:
            return True, ray.get(ref, timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError):
            return False, None  # slow, or a transient connection problem
        except ray.exceptions.RayActorError:
            if not self.lost:
                log.warning(
                    "the node agent of %s (node %s) is gone: its process counts as killed",
                    self._name,
                    self.node_id[:12],
                )
            self.lost = True
            return False, None


class SpreadHandle:
    """A rank group per node (`parts`, rank 0's node first) as one process with torchrun's semantics
    (rank_group.first_failure). The pid is rank 0's node group's: the probes compare it with the
    heartbeat and readiness its rank 0 writes."""

    def __init__(self, parts: list, grace_s: float = rank_group.STOP_GRACE_S, clock=time.monotonic) -> None:
        self.parts = list(parts)
        self.pid = self.parts[0].pid
        self.node_id = self.parts[0].node_id
        self._grace_s, self._clock = grace_s, clock
        self._failed: Optional[int] = None
        self._kill_at = 0.0  # after a failure: when those still running get SIGKILL

    def poll(self) -> Optional[int]:
        codes = [part.poll() for part in self.parts]
        if self._failed is None:
            failed = rank_group.first_failure(codes)
            if failed is None:
                return 0 if all(code == 0 for code in codes) else None
            self._failed, self._kill_at = failed, self._clock() + self._grace_s
            log.info("a rank group failed (%s): stopping those on the other nodes", failed)
            for part, code in zip(self.parts, codes):
                if code is None:
                    part.signal_group(signal.SIGTERM)
        running = [part for part, code in zip(self.parts, codes) if code is None]
        if not running:
            return self._failed
        now = self._clock()
        if now >= self._kill_at:
            for part in running:
                part.signal_group(signal.SIGKILL)  # also the agent's sweep of that group
            if now >= self._kill_at + self._grace_s:  # killed, but no news of it: do not wait forever
                return self._failed
        return None

    def signal_group(self, sig: int) -> None:
        for part in self.parts:
            part.signal_group(sig)

    def descendants(self, fresh: bool = False) -> list[int]:
        return []  # each node's agent records and sweeps its own


class RaySpawner:
    def __init__(
        self,
        world: WorldConfig,
        bundles: dict[str, list[placement.Bundle]],
        run_tag: str,
        *,
        local: Optional[Spawner] = None,
        same_machine_only: bool = False,
        anchors: Optional[dict[str, str]] = None,
    ) -> None:
        """`bundles`: every process of the run (start order) → its bundles ([] = local; one per rank
        for a rank group that may span nodes). `same_machine_only`: the run's servers listen on
        loopback. `anchors`: process → the process whose node it must share (placement.colocate)."""
        self._world = world
        self._bundles = dict(bundles)
        self._reserved, self._owner = placement.colocate(self._bundles, anchors or {})
        # The placement group's bundles in order, named for messages; and each placed process's
        # bundle indices in it (an anchored process: its anchor's first).
        self._placed: list[str] = []
        self._index: dict[str, list[int]] = {}
        for owner, owned in self._reserved.items():
            self._index[owner] = list(range(len(self._placed), len(self._placed) + len(owned)))
            self._placed += [owner] if len(owned) == 1 else [f"{owner} rank {r}" for r in range(len(owned))]
        for name, owner in self._owner.items():
            self._index.setdefault(name, self._index[owner][:1])
        self._tag = run_tag
        self._local = local or LocalSpawner()
        self._same_machine_only = same_machine_only
        self._group = None
        self._agents: dict[str, Any] = {}  # node id → agent actor (Ray handles are untyped)
        self._remote_agent: Any = None  # NodeAgent as a Ray actor class (made once Ray is imported)

    # --- the Spawner protocol --------------------------------------------------------------------
    def spawn(self, spec: ProcessSpec) -> Handle:
        if spec.name not in self._bundles:
            raise ValueError(f"process {spec.name!r} is not in this run's placement ({', '.join(self._bundles)})")
        self.reserve()  # at the first spawn, whichever it is: nothing starts on a cluster too small
        if not self._bundles[spec.name]:
            return self._local.spawn(spec)
        env = dict(spec.env)
        env.update({name: path.read_text().strip() for name, path in spec.secret_env.items()})
        cwd = str(spec.cwd) if spec.cwd is not None else None
        indices = self._index[spec.name]
        bundle_nodes = [self._agent_at(index, spec.name)[1] for index in indices] if len(indices) > 1 else []
        layout = placement.node_ranks(bundle_nodes)
        if len(layout) > 1:
            return self._spawn_spread(spec, indices, bundle_nodes, layout, env, cwd)
        # one bundle, or ranks that all landed on one node: the command as it is, as in world=local
        return self._start(spec.name, indices[0], list(spec.argv), str(spec.log_path), env, cwd)

    def _start(
        self, name: str, index: int, argv: list[str], log_path: str, env: dict[str, str], cwd: Optional[str]
    ) -> RayHandle:
        ray = _ray()
        for attempt in (1, 2):  # an agent may die between finding it and asking it: once more, anew
            agent, node_id = self._agent_at(index, name)
            try:
                pid = ray.get(agent.spawn.remote(argv, log_path, env, cwd), timeout=START_TIMEOUT_S)
                break
            except (ray.exceptions.RayError, TimeoutError) as exc:
                self._agents.pop(node_id, None)
                if attempt == 2:
                    raise EnvironmentProblem(
                        f"the node agent on node {node_id[:12]} could not start {name}: {exc}"
                    ) from None
        log.info("%s started on node %s (pid %d there)", name, node_id[:12], pid)
        return RayHandle(agent, pid, node_id, name)

    def _spawn_spread(
        self,
        spec: ProcessSpec,
        indices: list[int],
        bundle_nodes: list[str],
        layout: list[placement.NodeRanks],
        env: dict[str, str],
        cwd: Optional[str],
    ) -> SpreadHandle:
        """A rank group per node of `layout`, meeting at rank 0's node (that of the first bundle)."""
        ray = _ray()
        first, _ = self._agent_at(indices[0], spec.name)
        try:
            host = ray.get(first.info.remote(), timeout=START_TIMEOUT_S)["ip"]
            port = ray.get(first.free_port.remote(host), timeout=START_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise EnvironmentProblem(
                f"the node agent of {spec.name}'s rank 0 (node {bundle_nodes[0][:12]}) does not answer: {exc}"
            ) from None
        parts: list[RayHandle] = []
        try:
            for group in layout:
                argv = rank_group.node_command(
                    list(spec.argv),
                    nproc=group.nproc,
                    first_rank=group.first_rank,
                    node_rank=group.node_rank,
                    nnodes=len(layout),
                    world_size=len(indices),
                    master_addr=host,
                    master_port=port,
                )
                index = indices[bundle_nodes.index(group.node)]
                parts.append(self._start(spec.name, index, argv, str(spec.log_path), env, cwd))
        except BaseException:
            for part in parts:  # no rank group left behind by a start that failed half-way
                part.signal_group(signal.SIGKILL)
            raise
        log.info(
            "%s: ranks on %d nodes (%s), meeting at %s:%d",
            spec.name,
            len(layout),
            ", ".join(f"{g.node[:12]}: {g.nproc}" for g in layout),
            host,
            port,
        )
        return SpreadHandle(parts)

    # --- placement -----------------------------------------------------------------------------
    def reserve(self) -> None:
        """Join the cluster and reserve every placed process's bundle (once); EnvironmentProblem
        saying what is missing when the cluster cannot hold the run."""
        if self._group is not None or not self._placed:
            return
        connect(self._world.address or "auto")
        ray = _ray()
        from ray.util.placement_group import (
            get_placement_group,
            placement_group,
            placement_group_table,
            remove_placement_group,
        )

        wanted = [bundle for owned in self._reserved.values() for bundle in owned]
        name = f"rlrun-{self._tag}"
        try:  # a second spawner of the same run (a start retried on new ports) reuses the group
            group = get_placement_group(name)
            if [dict(b) for b in group.bundle_specs] != wanted or placement_group_table(group).get(
                "state"
            ) == "REMOVED":
                raise ValueError(name)
        except ValueError:
            nodes, _ = self._cluster()
            problems = placement.shortfall(self._reserved, nodes)
            if problems:
                raise EnvironmentProblem(
                    f"the Ray cluster at {self._world.address} cannot hold this run: {'; '.join(problems)}. "
                    f"Nodes: {placement.describe_nodes(nodes)}. Add nodes with those resources or change "
                    f"world.<role>.cpus/gpus/resources."
                ) from None
            group = placement_group(wanted, strategy="PACK", name=name)
        if not group.wait(timeout_seconds=self._world.placement_timeout_s):
            remove_placement_group(group)
            nodes, available = self._cluster()
            raise EnvironmentProblem(
                f"the Ray cluster at {self._world.address} could not reserve this run's resources within "
                f"world.placement_timeout_s={self._world.placement_timeout_s:g} s (other jobs may hold them, or the "
                f"bundles do not pack onto the nodes). Wanted: "
                f"{'; '.join(f'{n}: {placement.describe_bundles(b)}' for n, b in self._reserved.items())}. "
                f"Free now: {placement.describe(available)}. Nodes: {placement.describe_nodes(nodes)}."
            )
        self._group = group
        if not self._same_machine_only:
            return
        here = ray.util.get_node_ip_address()
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        at = {name: ips.get(self._bundle_node(index) or "", "?") for index, name in enumerate(self._placed)}
        elsewhere = {name: ip for name, ip in at.items() if ip != here}
        if elsewhere:
            self.close()
            where = ", ".join(f"{name} on {ip}" for name, ip in elsewhere.items())
            raise EnvironmentProblem(
                f"Ray placed {where}, another machine than this one ({here}), but the run's servers listen "
                f"on loopback (inference.host / streams.host = 127.0.0.1), which other machines cannot "
                f"reach. rlrun does not yet publish per-node server addresses: keep the run on this "
                f"machine's nodes (a custom resource in world.<role>.resources) — see docs/cluster.md."
            )

    def _cluster(self) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        ray = _ray()
        nodes = {
            f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": dict(n["Resources"])
            for n in ray.nodes()
            if n.get("Alive")
        }
        return nodes, dict(ray.available_resources())

    def _bundle_node(self, index: int) -> Optional[str]:
        """The node bundle `index` of the group is on, None while the group is not (re)placed."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self._group)
        if table.get("state") != "CREATED":
            return None
        return table["bundles_to_node_id"].get(index)

    # --- agents --------------------------------------------------------------------------------
    def _agent_at(self, index: int, name: str):
        """(agent, node id): the live agent of the node bundle `index` (of process `name`) is on,
        started if needed. Waits (up to world.placement_timeout_s) for Ray to re-place a bundle
        whose node was lost."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        deadline = time.monotonic() + self._world.placement_timeout_s
        while True:
            node_id = self._bundle_node(index)
            if node_id is not None:
                agent = self._agents.get(node_id)
                try:
                    if agent is None:
                        self._remote_agent = self._remote_agent or ray.remote(NodeAgent)
                        agent = self._remote_agent.options(
                            name=f"rlrun-agent-{self._tag}-{node_id[:16]}",
                            get_if_exists=True,
                            num_cpus=0,
                            max_restarts=0,
                            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                        ).remote()
                    remaining = max(1.0, deadline - time.monotonic())
                    ray.get(agent.info.remote(), timeout=min(remaining, START_TIMEOUT_S))
                    self._agents[node_id] = agent
                    return agent, node_id
                except (ray.exceptions.RayError, TimeoutError):
                    self._agents.pop(node_id, None)  # dead, or its node not (yet) known as lost
            if time.monotonic() > deadline:
                raise EnvironmentProblem(
                    f"{name} cannot be started again: its node is gone (or does not answer) and the Ray "
                    f"cluster has no node with {placement.describe_bundles(self._bundles[name])} free to "
                    f"take its place within world.placement_timeout_s={self._world.placement_timeout_s:g} s. "
                    f"Nodes alive: {placement.describe_nodes(self._cluster()[0])}. Add a node with those "
                    f"resources, then continue the run with `rlrun resume RUN_DIR`."
                )
            time.sleep(0.5)

    def server_hosts(self) -> dict[str, str]:
        return {}  # servers listen on inference.host / streams.host: the run stays on this machine's nodes (reserve() checks)

    def close(self) -> None:
        """Kill what the agents still run, the agents, and release the placement group (the
        cluster does this too when rlrun exits: all are owned by its driver)."""
        ray = _ray()
        for agent in list(self._agents.values()):
            try:
                ray.get(agent.stop_all.remote(), timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayError, TimeoutError):
                pass
            ray.kill(agent)
        self._agents.clear()
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None
