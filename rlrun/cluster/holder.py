"""Two guards for a process on a Ray node: `python -m rlrun.cluster.holder AGENT_PID -- CMD...`.

Why: Ray SIGKILLs the direct children of a worker process that exits (its
`kill_child_processes_on_worker_exit`, on by default). A guard started directly by the node agent
would die by that SIGKILL before it could kill its group, and the process under it would
survive the agent. So the agent starts this outer guard, which runs the ordinary guard
(`rlrun.supervisor.guard`) with itself as the parent to watch. Ray's SIGKILL lands on the outer
one; the inner one sees its parent go and SIGKILLs the whole group (the process and everything
it started). Where Ray leaves the children alone, the outer guard does the same when the agent
goes. Both pass the process's exit status through unchanged; the outer one leads the group (the
agent starts it in a session of its own), so its pid is the group's id.
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
