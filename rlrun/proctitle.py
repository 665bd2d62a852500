"""A role's process title: `ps` and `top` show `rlrun:actor --run-dir ...` instead of
`python -m rlrun.actor.main ...`. Called once from a role's entry point, never by library code."""

from __future__ import annotations

import sys


def name(role: str) -> None:
    """Title this process `rlrun:<role>` followed by its arguments (which hold no secrets)."""
    import setproctitle

    setproctitle.setproctitle(" ".join([f"rlrun:{role}", *sys.argv[1:]]))
