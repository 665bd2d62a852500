"""The progress watchdog: a run whose processes are all alive but which makes no progress has
stalled (a deadlock between processes that each heartbeat: a trainer waiting for groups, an actor
waiting for room). The launch code says what progress is (a marker that changes with it, like the
completion check, so this module knows nothing about RL); the supervisor acts on `ProgressClock`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Optional


@dataclass(frozen=True)
class ProgressWatch:
    """What the supervisor watches besides its processes, and what it does when it stalls."""

    marker: Callable[
        [], Optional[Hashable]
    ]  # changes with every unit of progress (None: cannot be told now); never raises
    timeout_s: float  # no change this long while every process is alive: the run has stalled
    suspects: tuple[str, ...]  # processes dumped and restarted (per their restart policy) when it stalls
    report: Callable[
        [str], Optional[Path]
    ]  # writes the run's state (why it is waiting) with this reason; the file; never raises
    setting: str = "progress_timeout_s"  # the config key of timeout_s, named in the reason


class ProgressClock:
    """Since when the run has made no progress, counted only while every process is alive (a
    process starting, restarting or without a sign of life is the process watchdog's business,
    and its end starts the count again). Pure: fed observations and the time."""

    def __init__(self, timeout_s: float, now: float) -> None:
        self.timeout_s = timeout_s
        self.since = now  # the last progress, or the last moment a process was not alive
        self.last: Optional[Hashable] = None

    def observe(self, marker: Optional[Hashable], all_alive: bool, now: float) -> Optional[float]:
        """How long the run has been quiet when that exceeds the timeout (a stall), else None."""
        if marker is None or marker != self.last or not all_alive:
            self.since = now
        if marker is not None:
            self.last = marker
        quiet = now - self.since
        return quiet if quiet > self.timeout_s else None

    def restart(self, now: float) -> None:
        self.since = now
