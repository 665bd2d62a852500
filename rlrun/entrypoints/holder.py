"""`python -m rlrun.entrypoints.holder AGENT_PID -- CMD...`: a process's two guards on a Ray node
(rlrun/cluster/holder.py). Imports only the holder and the guard: it must start fast.
"""

from __future__ import annotations

import sys

USAGE = "usage: python -m rlrun.entrypoints.holder AGENT_PID -- CMD..."


def main(argv: list[str]) -> int:
    from rlrun.cluster import holder

    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    return holder.run(int(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
