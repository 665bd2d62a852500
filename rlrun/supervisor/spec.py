"""What the supervisor is given: process specs, and the states a process goes through.

A spec is built by the roles (`rlrun/run/roles.py`; the trainer's processes by its backend,
`rlrun/backends/`): plain data, plus the probes and hooks the supervisor calls. The supervisor
knows nothing about what a process does — only how to start it, when it is ready, and how to
stop it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

from rlrun.supervisor.policy import RestartPolicy

# A probe is given the pid of the attempt it checks (so a restarted process is not taken for
# ready on the strength of its predecessor's marker). It must not raise and must return quickly.
Probe = Callable[[int], bool]


class ProcessState(str, Enum):
    PENDING = "pending"  # not started yet
    STARTING = "starting"  # spawned, readiness probe not yet passing
    BACKOFF = "backoff"  # failed; waiting out the backoff before its restart
    READY = "ready"  # readiness probe passed (or the process has none)
    EXITED = "exited"  # exited with code 0 where that is expected (its work is done)
    FAILED = "failed"  # exited unexpectedly, or never became ready
    STOPPING = "stopping"  # SIGTERM sent, waiting for the grace period
    STOPPED = "stopped"  # stopped by the supervisor


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # short and unique: "redis", "vllm-0", "trainer", "actor"
    argv: list[str]  # never through a shell
    log_path: Path  # stdout and stderr go here, never to an unread pipe
    env: dict[str, str] = field(default_factory=dict)  # added to the child's environment
    # Read from (0600) files at spawn time: never in a spec, a log line, a dry-run or a command line.
    secret_env: dict[str, Path] = field(default_factory=dict)
    cwd: Optional[Path] = None
    ready: Optional[Probe] = None  # None: ready as soon as it runs
    ready_timeout_s: float = 120.0
    stop_grace_s: float = 10.0  # SIGTERM, then SIGKILL after this long
    finishes: bool = False  # True: exit 0 means its work is done; False: a service, any exit is a failure
    restart: RestartPolicy = field(default_factory=lambda: RestartPolicy(restart=False))
    alive: Optional[Probe] = None  # liveness: True while it shows life (heartbeat, health check)
    stall_timeout_s: float = 60.0  # `alive` false this long while ready: stalled, killed, restarted
    before_start: Optional[Callable[[], None]] = None  # run before every (re)start, e.g. tidy a checkpoint dir
    # Stopped before the others, which keep running: a trainer finishing its step needs its inputs.
    stop_first: bool = False
    # Those that must be ready (or done) before it starts. None: every one before it; (): none.
    after: Optional[tuple[str, ...]] = None
