"""Two guards for a process on a Ray node: `python -m rlrun.cluster.holder AGENT_PID -- CMD...`.

Why: Ray SIGKILLs the direct children of a worker that exits, so a guard the agent started
directly would die before killing its group. The agent starts this outer guard, which runs the
ordinary guard (`rlrun.supervisor.guard`) watching it: Ray's SIGKILL lands here and the inner
guard then SIGKILLs the group. Exit statuses pass through; this one leads the group (its pid).
"""

from __future__ import annotations

import sys

from rlrun.supervisor import guard


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m rlrun.cluster.holder AGENT_PID -- CMD...", file=sys.stderr)
        return 2
    import os

    inner = [sys.executable, "-m", "rlrun.supervisor.guard", str(os.getpid()), "--", *argv[2:]]
    return guard.main([argv[0], "--", *inner])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
