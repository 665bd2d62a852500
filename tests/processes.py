"""The one "is anything of ours left?" check of the tests: processes recorded by pid and start
time (so a recycled pid is never mistaken for ours), looked up again after a grace period."""

from __future__ import annotations

import pickle
import textwrap
import threading
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


class ProcessCollector:
    """Processes recorded by a background thread while something runs, as (pid, start time), so
    that "none is left" is checked exactly and is unaffected by anything else on the machine.
    A subclass says what one look sees (`_look`, which records into `seen` and returns False when
    there is nothing left to look at) and how long `alive` waits by default (GRACE_S). Its own
    fields are set before `super().__init__()`, which starts the thread."""

    GRACE_S = 0.0
    EVERY_S = 0.3

    def __init__(self) -> None:
        self.seen: set[tuple[int, float]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _look(self) -> bool:
        raise NotImplementedError

    def _collect(self) -> None:
        while not self._stop.is_set() and self._look() is not False:
            self._stop.wait(self.EVERY_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def alive(self, grace_s: float | None = None) -> list[str]:
        return still_alive(self.seen, self.GRACE_S if grace_s is None else grace_s)


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


def report_to_parent(queue, item) -> None:
    """Put `item` (tensors included) on a multiprocessing queue as pickled bytes. A tensor put as
    it is travels as a file descriptor its process hands out on request, so a child that exits
    right after the put leaves the parent's read with a reset connection."""
    queue.put(pickle.dumps(item))


def report_from_child(queue, timeout_s: float = 60):
    """The next item a child put with `report_to_parent`."""
    return pickle.loads(queue.get(timeout=timeout_s))
