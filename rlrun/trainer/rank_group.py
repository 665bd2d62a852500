"""The trainer's ranks as one process, started as `python -m rlrun.entrypoints.rank_group --nproc N -- CMD...`.

Starts N copies of CMD with torchrun's environment (a free loopback port per attempt) and
torchrun's `--max-restarts 0` semantics: one rank fails, the others are stopped (SIGTERM, a grace,
SIGKILL) and the group exits with its status; 0 when all exit 0. `node_command` is one node's
share of a group spread over nodes (torchrun's multi-node options; world=ray, ray_world.py).
Why not torchrun: it puts every rank in a new session, out of the group the supervisor's guard
leads; here the ranks stay in it and die with this process (PR_SET_PDEATHSIG). Refuses: anything
about training; it only runs and watches CMD.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import time

from rlrun.listen import LOOPBACK, interface_of

POLL_S = 0.1
STOP_GRACE_S = 10.0  # a rank told to stop (SIGTERM) is SIGKILLed after this long
PR_SET_PDEATHSIG = 1
MODULE = "rlrun.entrypoints.rank_group"  # how a process spec runs it: `python -m MODULE ...`


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(
    rank: int,
    nproc: int,
    host: str,
    port: int,
    *,
    first_rank: int = 0,
    world_size: int | None = None,
    node_rank: int = 0,
    nnodes: int = 1,
) -> dict[str, str]:
    """torchrun's variables for local rank `rank` of the `nproc` ranks on this node, which are
    global ranks `first_rank`.. of `world_size` (default: a single-node group of `nproc`)."""
    env = {
        "RANK": str(first_rank + rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size or nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(nnodes),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
    }
    if host in LOOPBACK and (interface := interface_of(host)):  # gloo's pairs listen there too, not on every interface
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


def die_with_parent() -> None:
    """In a child, between fork and exec (`preexec_fn`): SIGKILL when its parent dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the supervisor's sweep still finds the ranks
        pass


def first_failure(codes: list[int | None]) -> int | None:
    """The status the group exits with once a rank has failed (the first failed rank's), or None."""
    return next((code for code in codes if code not in (None, 0)), None)


def run(
    cmd: list[str], nproc: int, host: str = "127.0.0.1", grace_s: float = STOP_GRACE_S, port: int = 0, **layout
) -> int:
    """Run the `nproc` ranks of this node; `layout`: rank_env's multi-node keywords."""
    port = port or free_port(host)
    procs = [
        subprocess.Popen(
            cmd, env={**os.environ, **rank_env(rank, nproc, host, port, **layout)}, preexec_fn=die_with_parent
        )
        for rank in range(nproc)
    ]
    # The supervisor signals the whole process group, the ranks included: they stop by themselves.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    while True:
        codes = [p.poll() for p in procs]
        failed = first_failure(codes)
        if failed is not None:
            _stop(procs, grace_s)
            return failed if failed > 0 else 128 - failed  # killed by signal s: 128 + s, as a shell says
        if all(code == 0 for code in codes):
            return 0
        time.sleep(POLL_S)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """A rank failed: the others cannot go on (their collectives would hang). SIGTERM, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlrun::trainer-ranks")
    parser.add_argument("--nproc", type=int, required=True, help="ranks on this node")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes of the group (one rank group each)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's place among them (0: rank 0's node)")
    parser.add_argument("--first-rank", type=int, default=0, help="the global rank of this node's first rank")
    parser.add_argument("--world-size", type=int, default=0, help="ranks on all nodes (default: --nproc)")
    parser.add_argument(
        "--master-addr", "--host", dest="host", default="127.0.0.1", help="rank 0's node: the rendezvous address"
    )
    parser.add_argument(
        "--master-port", type=int, default=0, help="its port (default: a free one; needed with --nnodes > 1)"
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    args.cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    args.world_size = args.world_size or args.nproc
    if args.nproc < 1 or not args.cmd:
        parser.error("need --nproc >= 1 and a command after --")
    if not (0 <= args.node_rank < args.nnodes) or args.first_rank < 0 or args.first_rank + args.nproc > args.world_size:
        parser.error("need 0 <= --node-rank < --nnodes and the ranks --first-rank .. + --nproc within --world-size")
    if args.nnodes > 1 and not args.master_port:
        parser.error("several nodes meet at one --master-addr/--master-port: give both")
    return args


def node_command(
    argv: list[str],
    *,
    nproc: int,
    first_rank: int,
    node_rank: int,
    nnodes: int,
    world_size: int,
    master_addr: str,
    master_port: int,
) -> list[str]:
    """`argv` (`... -m rlrun.entrypoints.rank_group --nproc N [...] -- CMD`, as a process spec holds
    it) as one node's rank group of a group spread over `nnodes` nodes."""
    at = next((i for i in range(1, len(argv)) if argv[i] == MODULE and argv[i - 1] == "-m"), None)
    if at is None:
        raise ValueError(f"not a rank group command (no -m {MODULE}): {argv[:6]}")
    try:
        own = parse(argv[at + 1 :])
    except SystemExit:  # argparse's way of refusing: here a ValueError, never an exit
        raise ValueError(f"not a valid rank group command: {argv[at + 1 : at + 8]}") from None
    if world_size != own.world_size:
        raise ValueError(f"the command runs {own.world_size} ranks, the layout {world_size}")
    options = {
        "--nproc": nproc,
        "--nnodes": nnodes,
        "--node-rank": node_rank,
        "--first-rank": first_rank,
        "--world-size": world_size,
        "--master-addr": master_addr,
        "--master-port": master_port,
    }
    return [*argv[: at + 1], *(str(x) for item in options.items() for x in item), "--", *own.cmd]
