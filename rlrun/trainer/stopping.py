"""A trainer asked to stop (SIGTERM: the supervisor's orderly stop, a SLURM job's end) stops at its
next step boundary with a checkpoint there, and its Redis calls stop insisting meanwhile: a SLURM
job's cancel signals all its processes at once, in no order, so Redis may be gone a moment before
the trainer's own signal arrives.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, TypeVar, overload

from rlrun.streams.server import stop_retrying

log = logging.getLogger("rlrun.trainer")

# A lost Redis waits this long for the trainer's own SIGTERM before it is a failure.
STOP_RACE_S = 2.0

T = TypeVar("T")
D = TypeVar("D")


class Stopping:
    """The stop request (`requested`, set by SIGTERM) and the trainer's Redis client (`redis`), with
    the rule for a Redis call made while the trainer may be stopping."""

    def __init__(self, redis, requested: threading.Event | None = None) -> None:
        self.redis = redis
        self.requested = requested if requested is not None else threading.Event()

    def soon(self) -> bool:
        """Asked to stop, now or within STOP_RACE_S (a dependency that just vanished may be
        stopping with us, its signal a moment ahead of ours)."""
        return self.requested.is_set() or self.requested.wait(STOP_RACE_S)

    @overload
    def call(self, action: Callable[[], T], default: D) -> T | D: ...
    @overload
    def call(self, action: Callable[[], T], default: None = None) -> T | None: ...
    def call(self, action: Callable[[], T], default: T | None = None) -> T | None:
        """`action()`; while stopping, Redis may be gone already: then `default`, and the step is
        recorded in files only. A lost acknowledgement costs nothing: a restart finds its place
        from the checkpoint's stream positions."""
        import redis

        if self.requested.is_set():
            stop_retrying(self.redis)  # (a client made after the signal)
        try:
            return action()
        except redis.ConnectionError as exc:
            if not self.soon():
                raise
            log.warning("Redis not reachable while stopping (%s): left out", exc)
            return default
