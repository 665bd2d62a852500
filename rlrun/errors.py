"""The error hierarchy the library raises, and the exit code each maps to.

Library code raises these; only the CLI turns them into messages and exit codes. Every message
says what is wrong and what to do about it. The codes are documented in the README.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug in rlrun: please report it with the --debug traceback
    USAGE = 2  # bad command line, unknown recipe/option/key, invalid config value
    ENVIRONMENT = 3  # something the run needs is missing or busy: a package, a binary, a model, a port
    RUN_DIR = 4  # the run directory cannot be used: it holds another run, is not a run, not writable
    PROCESS_FAILED = 5  # a process of the run failed and its policy does not restart it; all stopped
    RESTARTS_EXHAUSTED = 6  # a process kept failing: its restart budget is spent; all stopped
    INTERRUPTED = 130  # stopped by Ctrl-C / SIGTERM; everything was stopped in order


class RlrunError(Exception):
    """Base of every error rlrun reports to the user."""

    exit_code: ExitCode = ExitCode.INTERNAL


class ConfigError(RlrunError):
    exit_code = ExitCode.USAGE


class EnvironmentProblem(RlrunError):
    exit_code = ExitCode.ENVIRONMENT


class RunDirError(RlrunError):
    exit_code = ExitCode.RUN_DIR


class ProcessFailed(RlrunError):
    exit_code = ExitCode.PROCESS_FAILED

    def __init__(self, message: str, process: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.process = process
        self.log_tail = log_tail


class RestartsExhausted(ProcessFailed):
    exit_code = ExitCode.RESTARTS_EXHAUSTED


class Interrupted(RlrunError):
    exit_code = ExitCode.INTERRUPTED
