"""The operating-system edge of the supervisor: spawning local children and signalling them.

Every child runs in its own session (so its process group can be signalled as a whole) under a
small guard (`guard.py`) that kills the group if rlrun itself dies, and writes to its log file.
The pid the supervisor tracks is the group's leader: probes compare it with `os.getpgrp()`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional, Protocol

from rlrun.supervisor.spec import ProcessSpec


class Handle(Protocol):
    pid: int

    def poll(self) -> Optional[int]: ...
    def signal_group(self, sig: int) -> None: ...
    def descendants(self) -> list[int]: ...


class Spawner(Protocol):
    def spawn(self, spec: ProcessSpec) -> Handle: ...


class LocalHandle:
    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid

    def poll(self) -> Optional[int]:
        return self._popen.poll()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def descendants(self) -> list[int]:
        import psutil

        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.Error:
            return []


class LocalSpawner:
    def spawn(self, spec: ProcessSpec) -> LocalHandle:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **spec.env}
        env.update({name: path.read_text().strip() for name, path in spec.secret_env.items()})
        with open(spec.log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                [sys.executable, "-m", "rlrun.supervisor.guard", str(os.getpid()), "--", *spec.argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=spec.cwd,
                env=env,
                start_new_session=True,
            )
        return LocalHandle(popen)


def kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL the given processes that still exist; return those that were killed."""
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
