"""The rules of restarts: how an exit is classified, and whether and when a process is restarted.

Pure: the supervisor feeds a `RestartTracker` per process what it sees and the time, and acts on
the `Decision` it gets back. Which exits are retried is data here, not ifs in the poll loop.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum
from typing import Literal, Optional

from rlrun.errors import ExitCode

# rlrun's children exit 2 (the CLI's `ExitCode.USAGE`, argparse's too) for a usage or configuration
# error: never retried, the next start would fail the same way.
CONFIG_ERROR_CODE = int(ExitCode.USAGE)


@dataclass(frozen=True)
class RestartPolicy:
    """When a failed process is restarted, how long after, and how often at most."""

    restart: bool = True  # False: the first failure of this process stops the run
    max_restarts: int = 3  # restart budget: at most this many restarts within `window_s`
    window_s: float = 300.0  # length of the sliding window the budget is counted in
    backoff_initial_s: float = 1.0  # delay before the first restart after a healthy period
    backoff_factor: float = 2.0  # each consecutive failure multiplies the delay by this
    backoff_max_s: float = 30.0  # the delay never exceeds this
    healthy_after_s: float = 60.0  # a process up at least this long before failing has its backoff reset

    def __post_init__(self) -> None:
        checks = [
            (self.max_restarts >= 0, "max_restarts", "must be >= 0"),
            (self.window_s > 0, "window_s", "must be > 0"),
            (self.backoff_initial_s >= 0, "backoff_initial_s", "must be >= 0"),
            (self.backoff_factor >= 1, "backoff_factor", "must be >= 1"),
            (self.backoff_max_s >= self.backoff_initial_s, "backoff_max_s", "must be >= backoff_initial_s"),
            (self.healthy_after_s >= 0, "healthy_after_s", "must be >= 0"),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise ValueError(f"restart policy: {name} {rule} (got {getattr(self, name)!r})")

    def backoff_s(self, consecutive_failures: int) -> float:
        if consecutive_failures < 1:
            raise ValueError(f"consecutive_failures must be >= 1, got {consecutive_failures}")
        try:
            delay = self.backoff_initial_s * self.backoff_factor ** (consecutive_failures - 1)
        except OverflowError:
            return self.backoff_max_s
        return min(delay, self.backoff_max_s)


class ExitKind(Enum):
    DONE = "done"  # exit 0 of a process whose work finishes (`finishes=True`)
    CONFIG_ERROR = "config_error"  # exit CONFIG_ERROR_CODE (2): usage or configuration error; never retried
    CRASH = "crash"  # any other exit code, an unknown status, or a service that exited at all
    KILLED = "killed"  # death by a signal; `ExitInfo.signal` names it
    STALLED = "stalled"  # killed by the watchdog after no progress for the stall timeout


@dataclass(frozen=True)
class ExitInfo:
    """How a process ended, classified, with a sentence a person can read."""

    kind: ExitKind
    code: Optional[int]  # the raw status: >= 0 an exit code, < 0 minus the signal number, None unknown
    description: str  # "exited with code 3", "killed by SIGKILL (possibly the OOM killer)", ...
    signal: Optional[str] = None  # KILLED: the signal's name, e.g. "SIGKILL"

    @property
    def is_failure(self) -> bool:
        return self.kind is not ExitKind.DONE


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify_exit(
    code: Optional[int], *, finishes: bool, stalled: bool = False, stalled_for_s: Optional[float] = None
) -> ExitInfo:
    """Classify a process's end from `Popen.returncode`. `finishes`: exit 0 is success (False: a
    service, any exit is a failure); `stalled`: the watchdog killed it (wins over the status)."""
    if stalled:
        quiet = f" for {stalled_for_s:g} s" if stalled_for_s is not None else ""
        return ExitInfo(ExitKind.STALLED, code, f"stalled: no progress{quiet}, killed by the watchdog")
    if code is None:
        return ExitInfo(ExitKind.CRASH, None, "ended with an unknown exit status")
    if code < 0:
        name = _signal_name(-code)
        hint = " (possibly the OOM killer)" if -code == signal.SIGKILL else ""
        return ExitInfo(ExitKind.KILLED, code, f"killed by {name}{hint}", signal=name)
    if code == CONFIG_ERROR_CODE:
        return ExitInfo(ExitKind.CONFIG_ERROR, code, f"exited with code {code} (usage or configuration error)")
    if code == 0:
        if finishes:
            return ExitInfo(ExitKind.DONE, code, "exited with code 0 (done)")
        return ExitInfo(ExitKind.CRASH, code, "exited with code 0 although it is a service")
    return ExitInfo(ExitKind.CRASH, code, f"exited with code {code}")


@dataclass(frozen=True)
class Decision:
    action: Literal["restart", "give_up"]
    delay_s: float  # restart: wait this long before starting it again; give_up: 0
    reason: str  # one sentence for the events and the final message
    restarts_used: int  # restarts within the window, counting this one if it is a restart
    budget: int  # the policy's max_restarts


class RestartTracker:
    """The restart history of one process, fed events and the time. The budget counts restarts
    granted within the last `window_s`; the backoff grows with consecutive failures and starts
    again after `healthy_after_s` up."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.consecutive_failures = 0  # failures since the last healthy period
        self._restart_times: list[float] = []
        self._started_at: Optional[float] = None

    def on_started(self, now: float) -> None:
        self._started_at = now

    def restarts_used(self, now: float) -> int:
        """Restarts granted within the window that ends at `now` (for the live view)."""
        return sum(1 for t in self._restart_times if now - t < self.policy.window_s)

    def on_failure(self, now: float, info: ExitInfo) -> Decision:
        if not info.is_failure:
            raise ValueError(f"not a failure: {info.description}")
        policy = self.policy
        budget = policy.max_restarts
        uptime = None if self._started_at is None else now - self._started_at
        self._started_at = None
        self._restart_times = [t for t in self._restart_times if now - t < policy.window_s]
        used = len(self._restart_times)

        def give_up(why: str) -> Decision:
            return Decision("give_up", 0.0, f"{info.description}: {why}", used, budget)

        if info.kind is ExitKind.CONFIG_ERROR:
            return give_up("not retried, it would fail the same way")
        if not policy.restart:
            return give_up("restarts are disabled for this process")
        if used >= budget:
            if budget == 0:
                return give_up("no restarts allowed (max_restarts is 0)")
            return give_up(f"{budget} restarts within {policy.window_s:g} s used up")

        healthy = uptime is not None and uptime >= policy.healthy_after_s
        self.consecutive_failures = 1 if healthy else self.consecutive_failures + 1
        delay = policy.backoff_s(self.consecutive_failures)
        self._restart_times.append(now)
        used += 1
        reason = f"{info.description}: restart {used} of {budget} within {policy.window_s:g} s, in {delay:g} s"
        return Decision("restart", delay, reason, used, budget)
