"""A role's own stack dump on demand: `kill -USR1 PID` writes every thread's Python stack to the
process's stderr (its log file), through the standard library's `faulthandler`.

The supervisor's diagnostics use py-spy first; this is for machines where ptrace is not allowed.
Called once from a role's `main()` (an entry point, like the CLI: library code installs no
handlers).
"""

from __future__ import annotations

import faulthandler
import signal


def enable() -> None:
    """SIGUSR1 dumps all threads' stacks to stderr; the process then goes on running."""
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
