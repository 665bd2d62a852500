"""The one "is anything of ours left?" check of the tests: processes recorded by pid and start
time (so a recycled pid is never mistaken for ours), looked up again after a grace period."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterable

import psutil

# A process that starts a grandchild in a session of its own (it leaves the process group, as
# vLLM's engine core may), prints "grandchild <pid>", then sleeps: what a sweep must still find.
ESCAPING_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print("grandchild", child.pid, flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    """The process runs (a zombie does not: it has exited, its parent has yet to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_alive(seen: Iterable[tuple[int, float]], grace_s: float = 0.0) -> list[str]:
    """Of the processes `seen` as (pid, start time), those still alive after up to `grace_s`,
    as "pid: command line" (zombies count as gone: their parent has yet to reap them)."""
    seen = list(seen)

    def alive() -> list[str]:
        left = []
        for pid, started in seen:
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid}: {' '.join(proc.cmdline())[:120]}")
            except psutil.Error:
                pass
        return left

    deadline = time.time() + grace_s
    while alive() and time.time() < deadline:
        time.sleep(0.2)
    return alive()


def listening_sockets(pids: Iterable[int]) -> dict[tuple[str, int], str]:
    """Every TCP socket the processes `pids` listen on, as {(address, port): "pid command"}."""
    found = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found[(conn.laddr.ip, conn.laddr.port)] = f"{pid} {' '.join(proc.cmdline())[:100]}"
        except psutil.Error:
            pass
    return found


def off_loopback(sockets: dict[tuple[str, int], str]) -> dict[tuple[str, int], str]:
    """Of `listening_sockets`, those another machine could reach: any address but 127.0.0.0/8 and ::1."""
    return {(ip, port): who for (ip, port), who in sockets.items() if not (ip.startswith("127.") or ip == "::1")}
