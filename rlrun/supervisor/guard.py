"""A tiny guard between the supervisor and each child, started as
`python -m rlrun.entrypoints.guard PPID [--cpus 0,1] -- CMD...`.

The parent-death signal reaches only a direct child, and vLLM's engine core outlives a SIGKILLed
API server. The guard leads the child's process group and kills the whole group when the
supervisor disappears (even by SIGKILL); otherwise it runs CMD and exits as CMD did. With
`--cpus`, CMD and everything it starts may run on those cores only.
"""

from __future__ import annotations

import os
import signal
import subprocess

POLL_S = 0.2


def run(parent: int, cmd: list[str], cpus: set[int] | frozenset[int] = frozenset()) -> int:
    """Run `cmd` in this process's group, killing the group should `parent` disappear; exit as it did."""
    if cpus:
        os.sched_setaffinity(0, cpus)  # inherited by CMD and all it starts
    # SIGTERM from the supervisor reaches the whole group, the child included: the guard itself
    # only waits for the child to finish its own shutdown.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    child = subprocess.Popen(cmd)
    while True:
        try:  # wakes the moment the child exits (a restart starts sooner), else every POLL_S
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:  # the supervisor is gone: take the whole group down
            os.killpg(0, signal.SIGKILL)
    if code < 0:  # die the way the child died, so the supervisor reads the same status
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # these two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code
