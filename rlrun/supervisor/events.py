"""Structured supervisor events, one JSON object a line in the run's `events.jsonl`."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Optional

from rlrun.rundir import read_jsonl

log = logging.getLogger(__name__)

_NUMBER = (int, float)
_NONE = type(None)
# The fields readers use (status, runs, logs, plot, ETTR), with the types the supervisor writes
# them in. A line holding one of them with another type (a hand edit, a torn write, another
# program's line) is not an event of ours: it is skipped, as a line cut short is.
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "time": _NUMBER, "event": (str,), "process": (str,), "pid": (int, _NONE), "log": (str,), "reason": (str,),
    "action": (str,), "status": (str, _NONE), "file": (str, _NONE), "attempt": (int,), "launch": (int, _NONE),
    "quiet_s": _NUMBER, "previous_status": (str, _NONE), "exit": (str,),
}  # fmt: skip
MAX_TEXT = 2000  # characters kept of a string field: an event is a line for people, never a payload


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of an events.jsonl in order: malformed lines skipped, long strings cut to MAX_TEXT."""
    events = []
    for record in read_jsonl(path):
        if not _well_formed(record):
            continue
        events.append({k: v[:MAX_TEXT] + " (cut)" if isinstance(v, str) and len(v) > MAX_TEXT else v for k, v in record.items()})
    return events


def _well_formed(record: dict) -> bool:
    if "event" not in record:
        return False
    for name, types in FIELD_TYPES.items():
        value = record.get(name)
        if name in record and (isinstance(value, bool) or not isinstance(value, types)):
            return False
    return "time" not in record or math.isfinite(record["time"])


class EventLog:
    def __init__(self, path: Optional[Path], clock=time.time) -> None:
        self._path = path
        self._clock = clock
        self.recorded: list[dict[str, Any]] = []  # kept in memory too, for tests: the run reads events.jsonl

    def emit(self, event: str, **fields: Any) -> None:
        record = {"time": round(self._clock(), 3), "event": event, **fields}
        self.recorded.append(record)
        log.info("%s %s", event, " ".join(f"{k}={v}" for k, v in fields.items()))
        if self._path is not None:
            with open(self._path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
