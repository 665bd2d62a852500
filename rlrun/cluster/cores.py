"""Which CPU cores each local process may run on (world=local, `world.cpu_affinity=auto`): the vLLM
servers get cores of their own, everything else (trainer, actor, Redis, the weight follower)
shares the rest. Pure; the guard applies it (`rlrun/supervisor/guard.py --cpus`).

Why (bench/README.md, "In-flight weight updates again"): unpinned on 2 cores, vLLM's engine
(its model on `inference.threads` OpenMP threads), its API server and the trainer's torch threads
take turns on every core: the trainer's work per step took 0.289 s instead of 0.168 s pinned.
(Before vLLM ran its model in the engine process, its engine and worker also busy-waited for
each other on whichever core they found: shm_broadcast's `sched_yield` loop.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SERVER_PROCESSES = 2  # besides its worker's OpenMP threads, a server runs an API server and an engine core


def split_cores(
    available: Iterable[int], servers: int, threads_per_server: int
) -> tuple[list[tuple[int, ...]], tuple[int, ...]] | None:
    """The cores of each vLLM server and the cores the other processes share, from `available`
    (in order). Each server gets up to `threads_per_server + SERVER_PROCESSES` cores while at least
    one core is left for the rest; None (no pinning) when not every server can have one core."""
    cores = sorted(available)
    if servers < 1 or len(cores) < servers + 1:
        return None
    per_server = max(1, min(threads_per_server + SERVER_PROCESSES, (len(cores) - 1) // servers))
    taken = servers * per_server
    return [tuple(cores[i * per_server : (i + 1) * per_server]) for i in range(servers)], tuple(cores[taken:])


def cores_by_process(
    available: Iterable[int], server_names: Sequence[str], threads_per_server: int
) -> dict[str, tuple[int, ...]]:
    """`split_cores` as a map from process name to its cores; `""` maps every other process. Empty: no pinning."""
    split = split_cores(available, len(server_names), threads_per_server)
    if split is None:
        return {}
    per_server, rest = split
    return {**dict(zip(server_names, per_server)), "": rest}
