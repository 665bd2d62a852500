"""The operating-system edge of the supervisor: spawning local children and signalling them.

Every child runs in its own session (so its process group can be signalled as a whole) under a
small guard (`guard.py`) that kills the group if rlrun itself dies, and writes to its log file.
The pid the supervisor tracks is the group's leader: probes compare it with `os.getpgrp()`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Optional, Protocol

from rlrun.supervisor.spec import ProcessSpec


class Handle(Protocol):
    pid: int

    def poll(self) -> Optional[int]: ...
    def signal_group(self, sig: int) -> None: ...
    def descendants(self, fresh: bool = False) -> list[int]: ...  # fresh: not from a cached process table


class Spawner(Protocol):
    def spawn(self, spec: ProcessSpec) -> Handle: ...
    def close(self) -> None: ...  # after the supervisor stopped everything: release what it holds
    def server_hosts(
        self,
    ) -> dict[str, str]: ...  # server process → the address it must listen on, where not the config's


class ProcessTree:
    """Who is whose child, read from /proc at most once per `max_age_s` for all handles (psutil's
    `children(recursive=True)` per process and poll was a noticeable part of the supervisor's CPU)."""

    def __init__(self, max_age_s: float = 0.25, clock=time.monotonic) -> None:
        self._max_age_s, self._clock = max_age_s, clock
        self._children: dict[int, list[int]] = {}
        self._read_at: Optional[float] = None

    def descendants(self, pid: int, fresh: bool = False) -> list[int]:
        """`pid`'s descendants; `fresh` re-reads /proc (before a stop or a kill: none may escape)."""
        now = self._clock()
        if fresh or self._read_at is None or now - self._read_at > self._max_age_s:
            children: dict[int, list[int]] = {}
            for child, parent in parents().items():
                children.setdefault(parent, []).append(child)
            self._children, self._read_at = children, now
        found, todo = [], list(self._children.get(pid, ()))
        while todo:
            child = todo.pop()
            found.append(child)
            todo.extend(self._children.get(child, ()))
        return found


def parents() -> dict[int, int]:
    """Every process's parent, pid → ppid: read from /proc/<pid>/stat in one pass where there is a
    /proc (psutil's per-process objects cost three times as much), from psutil elsewhere."""
    if not os.path.isdir("/proc/self"):
        import psutil

        return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p.info["ppid"] is not None}
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # it exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        found[int(entry.name)] = int(stat[stat.rindex(b")") + 2 :].split(maxsplit=2)[1])
    return found


class LocalHandle:
    def __init__(self, popen: subprocess.Popen, tree: ProcessTree) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._tree = tree

    def poll(self) -> Optional[int]:
        return self._popen.poll()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def descendants(self, fresh: bool = False) -> list[int]:
        return self._tree.descendants(self.pid, fresh)


class LocalSpawner:
    """`cores`: the CPU cores each process (by name; `""`: any other) may run on; empty: anywhere."""

    def __init__(self, cores: dict[str, tuple[int, ...]] | None = None) -> None:
        self._tree = ProcessTree()  # one /proc read per poll for all the children
        self.cores = dict(cores or {})

    def spawn(self, spec: ProcessSpec) -> LocalHandle:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.env}
        env.update({name: path.read_text().strip() for name, path in spec.secret_env.items()})
        cores = self.cores.get(spec.name, self.cores.get(""))
        pin = ["--cpus", ",".join(map(str, cores))] if cores else []
        with open(spec.log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                [sys.executable, "-m", "rlrun.entrypoints.guard", str(os.getpid()), *pin, "--", *spec.argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=spec.cwd,
                env=env,
                start_new_session=True,
            )
        return LocalHandle(popen, self._tree)

    def close(self) -> None:
        """Nothing to release: the supervisor's stop already reaped every child."""

    def server_hosts(self) -> dict[str, str]:
        return {}  # every server here listens where the config says


def kill_pids(pids: list[int]) -> list[int]:
    import psutil

    killed = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            proc.kill()
            killed.append(pid)
        except psutil.Error:
            pass
    return killed
