"""Waiting in tests: on a condition, with a deadline (never a fixed sleep before an assertion)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float = 10.0, what: str = "the condition") -> T:
    """`condition()`'s first true value, polled every 20 ms; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)
    return value


def aof_written(client) -> bool:
    """Redis has written everything it holds to its append-only file (`appendfsync everysec` may
    hold writes back while an fsync runs): what a SIGKILL of the server, not of the machine, keeps."""
    info = client.info("persistence")
    return info["aof_buffer_length"] == 0 and info["aof_pending_bio_fsync"] == 0 and info["aof_last_write_status"] == "ok"
