"""What every role's process spec is made of, whatever starts it: where the run's services listen
(`Endpoints`), a child's environment and restart policy, and the probes that read the run's Redis.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, fields
from typing import Callable

import yaml

from rlrun.config.schema import RoleSupervision, SupervisorConfig
from rlrun.rundir import RunDir
from rlrun.streams import server as redis_server
from rlrun.supervisor.policy import RestartPolicy
from rlrun.supervisor.spec import ProcessSpec

HEARTBEAT_FRESH_S = 5.0  # a heartbeat older than this is "no sign of life" for this poll


@dataclass(frozen=True)
class Endpoints:
    """Where the run's services listen (ports chosen by the launcher)."""

    redis_url: str
    redis_port: int | None  # None when streams.url names an external server
    vllm_urls: list[str]
    broadcast_port: int = 0  # the trainer's weight broadcast rendezvous (0: its backend needs none)
    # Where a server listens when its world places it on another node than the supervisor's
    # (world=slurm spanning nodes): process ("redis", "vllm-0", "trainer" for its broadcast) → its
    # node's address. Absent: inference.host / streams.host.
    hosts: dict[str, str] = field(default_factory=dict)

    def host(self, process: str, default: str) -> str:
        return self.hosts.get(process, default)


def child_env(threads: int) -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def role_spec(sup: SupervisorConfig, run_dir: RunDir, name: str, role: str, **spec) -> ProcessSpec:
    """Process `name`'s spec with its log file and role's settings (`supervisor.<role>`, and the
    supervisor's readiness deadline and stop grace) unless `spec` gives them."""
    settings: RoleSupervision = getattr(sup, role)
    policy = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "stall_timeout_s"}
    policy["backoff_max_s"] = max(settings.backoff_max_s, settings.backoff_initial_s)
    defaults = dict(
        log_path=run_dir.log(name),
        ready_timeout_s=sup.ready_timeout_s,
        stop_grace_s=sup.stop_grace_s,
        restart=RestartPolicy(**policy),
        stall_timeout_s=settings.stall_timeout_s,
    )
    return ProcessSpec(name=name, **{**defaults, **spec})


class HeartbeatAges:
    """How long ago each heartbeat was last seen to change, on the supervisor's own clock. A child
    on another node stamps its heartbeat with that node's clock: compared with ours, a skew of a
    few seconds reads as silence (a healthy process restarted as stalled) or as life. Only a value
    seen for the first time is aged by the clocks, for want of anything better."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self._clock, self._wall_clock = clock, wall_clock
        self._changed: dict[tuple, tuple[float, float]] = {}  # heartbeat -> (its value, when we saw it change)

    def age_s(self, heartbeat: tuple, stamp: float) -> float:
        """Seconds since `heartbeat` (a key naming one writer's field) last changed to `stamp`."""
        now = self._clock()
        seen = self._changed.get(heartbeat)
        if seen is None:  # first sight: its age by the clocks, never below 0 (a clock ahead of ours)
            self._changed[heartbeat] = (stamp, now - max(self._wall_clock() - stamp, 0.0))
        elif seen[0] != stamp:
            self._changed[heartbeat] = (stamp, now)
        return now - self._changed[heartbeat][1]


class RedisProbe:
    """Probes that read the run's Redis, with one lazily (re)connected client. Never raise."""

    def __init__(self, url: str, run_dir: RunDir) -> None:
        self._url, self._run_dir = url, run_dir
        self._client = None
        self._ages = HeartbeatAges()

    def ping(self, pid: int = 0) -> bool:
        """PING on the probe's own connection (a new connection and AUTH per poll cost CPU)."""
        return self.call(lambda client: client.ping())

    def heartbeat(self, key: str, pid: int, max_age_s: float = HEARTBEAT_FRESH_S, also: tuple[str, ...] = ()) -> bool:
        """True when process `pid` wrote a heartbeat into hash `key` less than max_age_s ago, and
        so did each of the fields `also` (the other ranks of a process that has several)."""
        state = self._ask(lambda client: client.hgetall(key) or {}, {})
        try:
            if int(state.get("pid", -1)) != pid:
                return False
            ages = [self._ages.age_s((key, field, pid), float(state.get(field, 0))) for field in ("heartbeat", *also)]
            return all(age < max_age_s for age in ages)
        except ValueError:
            return False

    def marker(self, key: str, field: str, pid: int) -> bool:
        return self._ask(lambda client: client.hget(key, field), None) == str(pid)

    def call(self, action) -> bool:
        """Run `action(client)`; True if it went through, False if Redis could not be reached."""
        return self._ask(lambda client: action(client) or True, False)

    def stream_has_event_after(self, stream: str, after_id: str, needle: str) -> bool:
        """True when `stream` holds an entry newer than `after_id` whose fields contain `needle`."""
        entries = self._ask(lambda client: client.xrange(stream, min=f"({after_id}", count=1000), [])
        return any(needle in value for _id, fields in entries for value in fields.values())

    def _ask(self, action, default):
        """`action(client)`, or `default` when Redis cannot be reached: never an exception in the supervisor."""
        try:
            if self._client is None:
                password = self._run_dir.read_redis_password()
                self._client = redis_server.connect(self._url, password, socket_timeout=2.0, reconnect_s=0)
            return action(self._client)
        except Exception:  # not reachable means "no"
            self._client = None
            return default


def role_command(run_dir: RunDir, module: str, name: str, **settings) -> tuple[list[str], Callable[[], None]]:
    """(argv, before_start) of a child started as `python -m <module> <run>/roles/<name>.yaml`; the
    file is written before every (re)start from config.yaml and `settings` (`Role` fields)."""
    from rlrun.parts.role_file import Role, write_role_file

    def write() -> None:
        config = yaml.safe_load(run_dir.config.read_text())
        write_role_file(run_dir, Role(name=name, run_dir=run_dir.root, config=config, **settings))

    return [sys.executable, "-m", module, str(run_dir.role_file(name))], write
