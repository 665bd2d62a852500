"""`python -m rlrun.entrypoints.slurm_step --record PATH [--gpus 0,1 | --layout JSON] -- CMD...`:
the start of every srun step of a world=slurm run, on each of its nodes (rlrun/cluster/slurm_step.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from rlrun.cluster import slurm_step

    parser = argparse.ArgumentParser(prog="rlrun::slurm-step")
    parser.add_argument("--record", type=Path, required=True, help="where the first node's task records its pid")
    parser.add_argument("--gpus", default="", help="GPU indices (among the step's) of this one-node step")
    parser.add_argument("--layout", default="", help="ranks per node of a process spanning nodes (JSON)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("need a command after --")
    return slurm_step.run_step(args.record, args.gpus, args.layout, cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
