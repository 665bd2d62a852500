"""A role's process title: `ps -ef` shows `rlrun:actor <role file>`, and `top`, `ps -e` and
`pgrep` the short name `rlrun:actor`, instead of `python -m rlrun.entrypoints.actor <role file>`.
Called once from a role's entry point, never by library code."""

from __future__ import annotations

import sys


def name(role: str) -> None:
    """Title this process `rlrun:<role>` followed by its arguments (which hold no secrets). Its
    short name (the kernel's `comm`, cut to 15 characters) is `rlrun:<role>` alone, without a space:
    tools that read /proc/<pid>/stat word by word skip a process whose name holds one, SLURM's
    proctrack/linuxproc among them, which then neither signals it nor kills it with its job."""
    import setproctitle

    setproctitle.setproctitle(" ".join([f"rlrun:{role}", *sys.argv[1:]]))
    setproctitle.setthreadtitle(f"rlrun:{role}")  # this (main) thread's name is the process's
