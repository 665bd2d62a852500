"""The operating-system edge of the supervisor: spawning local children and signalling them.

Every child runs in its own session (so its process group can be signalled as a whole), gets
SIGKILL if rlrun itself dies (Linux parent-death signal), and writes to its log file.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Optional, Protocol

from rlrun.supervisor.spec import ProcessSpec

_PR_SET_PDEATHSIG = 1


class Handle(Protocol):
    pid: int

    def poll(self) -> Optional[int]: ...
    def signal_group(self, sig: int) -> None: ...
    def descendants(self) -> list[int]: ...


class Spawner(Protocol):
    def spawn(self, spec: ProcessSpec) -> Handle: ...


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the stop path and the descendant sweep still apply


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
        with open(spec.log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=spec.cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
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
