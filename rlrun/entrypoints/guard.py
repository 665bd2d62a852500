"""`python -m rlrun.entrypoints.guard PARENT_PID [--cpus 0,1] -- CMD...`: the guard of each child
the supervisor starts (rlrun/supervisor/guard.py). Imports only the guard: it starts before every
child and must start fast.
"""

from __future__ import annotations

import sys

USAGE = "usage: python -m rlrun.entrypoints.guard PARENT_PID [--cpus 0,1] -- CMD..."


def main(argv: list[str]) -> int:
    from rlrun.supervisor import guard

    cpus: set[int] = set()
    if len(argv) > 2 and argv[1] == "--cpus":
        cpus = {int(core) for core in argv[2].split(",")}
        argv = [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    return guard.run(int(argv[0]), argv[2:], cpus)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
