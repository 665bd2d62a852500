"""The trainer's ranks as one process: `python -m rlrun.trainer.rank_group --nproc N -- CMD...`.

Starts N copies of CMD with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a free loopback port per attempt) and gives the
supervisor torchrun's `--max-restarts 0` semantics: when one rank fails, the others are stopped
(SIGTERM, a grace, SIGKILL) and the group exits with that rank's status, so the supervisor's
restart policy restarts the whole group from the last complete checkpoint. All ranks exit 0: 0.

Why not torchrun itself: it starts every rank in a new session, out of the process group the
supervisor's guard leads, so a SIGKILLed supervisor or torchrun would leave ranks behind and the
ranks' process group would not be the pid the supervisor's probes know. Here the ranks stay in
the group (the supervisor's stop and the guard reach them directly) and die with this process
(PR_SET_PDEATHSIG). Refuses: anything about training; it only runs and watches CMD.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

POLL_S = 0.1
STOP_GRACE_S = 10.0  # a rank told to stop (SIGTERM) is SIGKILLed after this long
PR_SET_PDEATHSIG = 1


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(rank: int, nproc: int, host: str, port: int) -> dict[str, str]:
    """torchrun's variables for local rank `rank` of a single-node group of `nproc`."""
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0", "MASTER_ADDR": host, "MASTER_PORT": str(port),
    }  # fmt: skip


def _die_with_parent() -> None:  # in the child, between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the supervisor's sweep still finds the ranks
        pass


def first_failure(codes: list[int | None]) -> int | None:
    """The status the group exits with once a rank has failed (the first failed rank's), or None."""
    for code in codes:
        if code is not None and code != 0:
            return code
    return None


def run(cmd: list[str], nproc: int, host: str = "127.0.0.1", grace_s: float = STOP_GRACE_S) -> int:
    port = free_port(host)
    procs = [
        subprocess.Popen(cmd, env={**os.environ, **rank_env(rank, nproc, host, port)}, preexec_fn=_die_with_parent)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlrun::trainer-ranks")
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="the ranks' rendezvous address (loopback)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.nproc < 1 or not cmd:
        parser.error("need --nproc >= 1 and a command after --")
    return run(cmd, args.nproc, args.host)


if __name__ == "__main__":
    from rlrun import proctitle

    proctitle.name("trainer-ranks")
    sys.exit(main())
