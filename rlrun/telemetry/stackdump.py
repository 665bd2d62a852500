"""A role's own stack dump on demand: `kill -USR1 PID` writes every thread's Python stack to its
log (`faulthandler`), for machines where the supervisor's py-spy cannot ptrace. Called from a
role's `main()` only: library code installs no handlers.
"""

from __future__ import annotations

import faulthandler
import signal


def enable() -> None:
    """SIGUSR1 dumps all threads' stacks to stderr; the process then goes on running."""
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
