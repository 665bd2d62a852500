"""`python -m rlrun.entrypoints.rank_group --nproc N [...] -- CMD...`: the trainer's ranks as one
process (rlrun/trainer/rank_group.py), titled `rlrun:trainer-ranks`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from rlrun.trainer import rank_group

    args = rank_group.parse(sys.argv[1:] if argv is None else argv)
    layout = dict(first_rank=args.first_rank, world_size=args.world_size, node_rank=args.node_rank, nnodes=args.nnodes)
    return rank_group.run(args.cmd, args.nproc, args.host, port=args.master_port, **layout)


if __name__ == "__main__":
    from rlrun.telemetry import proctitle

    proctitle.name("trainer-ranks")
    sys.exit(main())
