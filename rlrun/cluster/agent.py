"""The node agent: starts and watches the run's processes on one node of a Ray cluster.

One per node (a Ray actor made by `ray_world.RaySpawner`; plain Python here, testable without
Ray): starts a command as the local spawner does (under rlrun's guard, own session, log file),
answers exit status, group signals, descendants and a free port. The guard kills the group when
the agent dies, so nothing of the run outlives it. Knows nothing about the supervisor's policies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

# Set by Ray in its worker processes (the agent's environment): they describe the agent's Ray
# worker, not the process it starts, and would make a child that imports Ray think it is one.
RAY_WORKER_VARIABLES = (
    "RAY_JOB_ID",
    "RAY_RAYLET_PID",
    "RAY_CLIENT_MODE",
    "RAY_LD_PRELOAD_ON_WORKERS",
    "PYTHONBREAKPOINT",
)


class NodeAgent:
    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen] = {}  # by pid of the guard (= the group's id)
        self._descendants: dict[int, set[int]] = {}  # every descendant seen, per group

    def info(self) -> dict:
        node_id, ip = "", ""
        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
            ip = ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - outside Ray (unit tests): no node id
            pass
        return {"node_id": node_id, "hostname": socket.gethostname(), "ip": ip, "pid": os.getpid()}

    def free_port(self, host: str) -> int:
        """A TCP port free on this node at `host` now (the rendezvous of ranks whose rank 0 runs here)."""
        from rlrun.trainer.rank_group import free_port

        return free_port(host)

    def spawn(self, argv: list[str], log_path: str, env: dict[str, str], cwd: Optional[str] = None) -> int:
        """Start `argv` under the guard; return the guard's pid (which leads the new group). `env`
        (added to this node's) carries the spec's secrets: never on a command line."""
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        child_env = {k: v for k, v in os.environ.items() if k not in RAY_WORKER_VARIABLES}
        child_env.update(env)
        with open(log_path, "ab", buffering=0) as log_file:
            popen = subprocess.Popen(
                [sys.executable, "-m", "rlrun.entrypoints.holder", str(os.getpid()), "--", *argv],  # guard in a guard
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=child_env,
                start_new_session=True,
            )
        self._children[popen.pid] = popen
        self._descendants[popen.pid] = set()
        return popen.pid

    def poll(self, pid: int) -> Optional[int]:
        """The exit status of group `pid` (negative: killed by that signal), None while it runs.
        Also records its descendants, so a later sweep finds those that left the group."""
        self._remember_descendants(pid)
        return self._child(pid).poll()

    def signal_group(self, pid: int, sig: int) -> None:
        """Signal the whole group; SIGKILL also kills every descendant seen (a sweep)."""
        self._remember_descendants(pid)
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if sig == signal.SIGKILL:
            from rlrun.supervisor.local import kill_pids

            kill_pids(sorted(self._descendants.get(pid, ())))

    def descendants(self, pid: int) -> list[int]:
        self._remember_descendants(pid)
        return sorted(self._descendants.get(pid, ()))

    def stop_all(self) -> list[int]:
        running = [pid for pid, popen in self._children.items() if popen.poll() is None]
        for pid in self._children:
            self.signal_group(pid, signal.SIGKILL)
        for pid in running:
            self._children[pid].wait()
        return running

    def _child(self, pid: int) -> subprocess.Popen:
        try:
            return self._children[pid]
        except KeyError:
            raise ValueError(f"this node agent did not start process {pid}") from None

    def _remember_descendants(self, pid: int) -> None:
        import psutil

        popen = self._child(pid)
        if popen.returncode is not None:
            return
        try:
            self._descendants[pid].update(p.pid for p in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            pass
