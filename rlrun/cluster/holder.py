"""Two guards for a process on a Ray node, started as
`python -m rlrun.entrypoints.holder AGENT_PID -- CMD...`.

Why: Ray SIGKILLs the direct children of a worker that exits, so a guard the agent started
directly would die before killing its group. The agent starts this outer guard, which runs the
ordinary guard (`rlrun.supervisor.guard`) watching it: Ray's SIGKILL lands here and the inner
guard then SIGKILLs the group. Exit statuses pass through; this one leads the group (its pid).
"""

from __future__ import annotations

import os
import sys

from rlrun.supervisor import guard

GUARD_MODULE = "rlrun.entrypoints.guard"


def run(agent: int, cmd: list[str]) -> int:
    """Guard the inner guard of `cmd` against `agent`'s death; exit as `cmd` did."""
    inner = [sys.executable, "-m", GUARD_MODULE, str(os.getpid()), "--", *cmd]
    return guard.run(agent, inner)
