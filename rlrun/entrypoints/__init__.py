"""Where each of rlrun's processes starts: `python -m rlrun.entrypoints.<name>`. Every `python -m`
main of rlrun is here; the library modules hold none and read no argv.

The roles (actor, trainer, weights, reward_worker) take a role file, `<run>/roles/<name>.yaml`
(`rlrun/parts/role_file.py`): rerun any role by hand with it. Each role's `main()` reads its role file,
builds the role's objects, runs them and always closes them, and turns what a restart would meet
again (a config, a checkpoint, a full disk) into exit 2, which the supervisor never retries.
Started as a module, a role first names its process (`rlrun:<role>` in `ps`: `proctitle`) and
arms its stack dump (`kill -USR1`: `stackdump`).

The process mechanics below the roles: `guard` (the guard of each child), `holder` (a process's
two guards on a Ray node), `rank_group` (a trainer's ranks as one process), `slurm_step` (each
srun step); and `config_reference`, which writes docs/config-reference.md. They parse their argv
and call one library function. This package imports nothing heavy at its top (a guard starts
before every child): asyncio and logging are imported where they are used.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from collections.abc import Coroutine
    from typing import Any, Callable, NoReturn

QUIET_LOGGERS = ("httpx",)  # a line per HTTP request (five per weight update and server) would bury the role's own


def configure_logging() -> None:
    """A role's log lines (its stderr goes to its log file); QUIET_LOGGERS only say what went wrong."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def exit_2_on(
    log: logging.Logger, *never_retried: type[Exception]
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """`main`'s errors that a restart would meet again (a config, damaged checkpoints, a full disk):
    logged in one line and turned into exit 2, which the supervisor never retries (the run stops at
    once with exit 5, naming the role's log). Whatever `main` opened it closes itself first."""
    import functools

    from rlrun.errors import ExitCode

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapped(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except never_retried as exc:
                log.error("%s", exc)
                return int(ExitCode.USAGE)

        return wrapped

    return wrap


def run_process(main: Callable[[], int], title: str) -> NoReturn:
    """`python -m rlrun.entrypoints.<role>`: the process titled `rlrun:<title>`, `kill -USR1`
    dumping its stacks into its log (the supervisor's fallback to py-spy), then `main()`'s exit code."""
    from rlrun.telemetry import proctitle, stackdump

    proctitle.name(title)
    stackdump.enable()
    raise SystemExit(main())


def run_until_sigterm(main: Coroutine[Any, Any, None], on_stop: Callable[[], None] = lambda: None) -> bool:
    """Run an asyncio role (the actor) to its end; True when SIGTERM (the supervisor's orderly
    stop, a SLURM job's end) ended it first. The signal cancels it where it waits, never inside the
    code between two waits: a group handed to the trainer is also in the audit, a journal append is
    whole. `on_stop` runs first (e.g. Redis clients stop retrying: a Redis stopping with us is not
    waited for). The caller closes what it opened, then `die_of(SIGTERM)`."""
    import asyncio

    stopped = False

    async def until_sigterm() -> None:
        task = asyncio.current_task()
        assert task is not None  # this coroutine's own

        def stop() -> None:
            nonlocal stopped
            stopped = True
            on_stop()
            task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        await main

    try:
        asyncio.run(until_sigterm())
    except asyncio.CancelledError:
        if not stopped:
            raise
    return stopped


def die_of(signum: int) -> NoReturn:
    """End this process by `signum`'s default action: the supervisor reads `killed by SIGTERM`, as
    it did before the role handled the signal itself."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    raise SystemExit(128 + signum)  # not reached: the signal ends the process first
