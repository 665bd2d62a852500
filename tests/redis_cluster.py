"""A throwaway Redis Cluster of N valkey servers on loopback, for tests and benchmarks.

rlrun never starts a cluster for a run (a cluster is an external Redis: `streams.url`); this
tests that path against a real one: the 16384 slots split evenly, no replicas, every node
requiring one password for its `default` user (as a team's shared cluster would) and `rlrun`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import redis

from rlrun.errors import EnvironmentProblem
from rlrun.streams.server import RLRUN_USER, find_server_binary, pick_free_port, ping, redis_url
from rlrun.supervisor import ProcessSpec, Supervisor, supervised

log = logging.getLogger(__name__)

SLOTS = 16384


def slot_ranges(nodes: int) -> list[tuple[int, int]]:
    """The 16384 slots split into `nodes` contiguous, inclusive ranges (pure)."""
    if nodes < 1:
        raise ValueError(f"a cluster needs at least one node, got {nodes}")
    bounds = [SLOTS * k // nodes for k in range(nodes + 1)]
    return [(bounds[k], bounds[k + 1] - 1) for k in range(nodes)]


@dataclass
class LocalCluster:
    host: str
    password: str
    ports: list[int] = field(default_factory=list)
    supervisor: Optional[Supervisor] = None  # runs the servers, as a run's supervisor runs its Redis

    @property
    def url(self) -> str:
        """The URL of the first node, with the `default` user (a cluster client finds the others)."""
        return redis_url(self.host, self.ports[0]).replace("redis://", "redis://default@", 1)

    @property
    def pids(self) -> list[int]:
        """The servers' own pids (each group's leader is the supervisor's guard)."""
        return [p.handle.descendants(fresh=True)[0] for p in self.supervisor.processes]

    def node(self, k: int) -> redis.Redis:
        """A plain client of node k alone (to see which keys it holds)."""
        return redis.Redis(host=self.host, port=self.ports[k], password=self.password, decode_responses=True)


def _config(directory: Path, host: str, port: int, bus_port: int, password: str) -> str:
    digest = hashlib.sha256(password.encode()).hexdigest()
    return "\n".join([
        f"bind {host}",
        f"port {port}",
        f"cluster-port {bus_port}",
        "cluster-enabled yes",
        "cluster-config-file nodes.conf",
        "cluster-node-timeout 5000",
        "protected-mode yes",
        f'dir "{directory}"',
        "appendonly yes",
        "appendfsync everysec",
        'save ""',
        f"user default reset on #{digest} ~* &* +@all",
        f"user {RLRUN_USER} reset on #{digest} ~* &* +@all",
        "",
    ])  # fmt: skip


@contextmanager
def local_cluster(
    directory: Path, password: str, nodes: int = 3, ready_timeout: float = 30.0
) -> Iterator[LocalCluster]:
    """Start `nodes` servers (through `supervised`, as a run starts its Redis), yield the cluster once
    every node says `cluster_state:ok`, and stop every server on exit (also when forming it failed)."""
    server = find_server_binary("auto")
    host = "127.0.0.1"
    cluster = LocalCluster(host, password)
    specs: list[ProcessSpec] = []
    bus_ports: list[int] = []
    for k in range(nodes):
        node_dir = (directory / f"node-{k}").resolve()
        node_dir.mkdir(parents=True, exist_ok=True)
        port, bus_port = pick_free_port(host), pick_free_port(host)
        conf = node_dir / "valkey.conf"
        conf.write_text(_config(node_dir, host, port, bus_port, password))
        conf.chmod(0o600)
        url = redis_url(host, port)
        specs.append(ProcessSpec(
            name=f"node-{k}", argv=[str(server), str(conf)], log_path=node_dir / "server.log", cwd=node_dir,
            ready=lambda pid, url=url: ping(url, password), ready_timeout_s=ready_timeout,
        ))  # fmt: skip
        cluster.ports.append(port)
        bus_ports.append(bus_port)
    with supervised(*specs) as cluster.supervisor:
        clients = [cluster.node(k) for k in range(nodes)]
        for client, (first, last) in zip(clients, slot_ranges(nodes)):
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for port, bus_port in zip(cluster.ports[1:], bus_ports[1:]):
            clients[0].execute_command("CLUSTER", "MEET", host, port, bus_port)  # the bus is not port + 10000
        deadline = time.monotonic() + ready_timeout
        while not all(_state_ok(c, nodes) for c in clients):
            if time.monotonic() > deadline:
                what = f"the cluster did not reach cluster_state:ok within {ready_timeout:.0f} s"
                raise EnvironmentProblem(f"{what} (ports {cluster.ports}); see the nodes' server.log")
            time.sleep(0.1)
        for c in clients:
            c.close()
        log.info("local Redis Cluster ready on ports %s", cluster.ports)
        yield cluster


def _state_ok(client: redis.Redis, nodes: int) -> bool:
    text = str(client.execute_command("CLUSTER", "INFO"))  # decode_responses: a str
    return "cluster_state:ok" in text and f"cluster_known_nodes:{nodes}" in text
