"""Structured supervisor events, one JSON object a line in the run's `events.jsonl`."""

from __future__ import annotations

import json
import logging
import math
import os
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
    "time": _NUMBER,
    "event": (str,),
    "process": (str,),
    "pid": (int, _NONE),
    "log": (str,),
    "reason": (str,),
    "action": (str,),
    "status": (str, _NONE),
    "file": (str, _NONE),
    "attempt": (int,),
    "launch": (int, _NONE),
    "quiet_s": _NUMBER,
    "previous_status": (str, _NONE),
    "exit": (str,),
}
MAX_TEXT = 2000  # characters kept of a string field: an event is a line for people, never a payload


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of an events.jsonl in order: malformed lines skipped, long strings cut to MAX_TEXT."""
    return [_cut_text(record) for record in read_jsonl(path) if _well_formed(record)]


class EventTail:
    """An events.jsonl read as it grows: each `read` returns the events appended since the last one
    (as read_events would: in order, malformed lines skipped), reading only those bytes. A line
    still being written is left for the next read."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self._path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._offset:  # replaced by a shorter file: read it anew
                    self._offset = 0
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        events = []
        for line in data[:complete].decode(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # as read_jsonl: a line cut short, or of nested brackets
                continue
            if isinstance(record, dict) and _well_formed(record):
                events.append(_cut_text(record))
        return events


def _cut_text(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v[:MAX_TEXT] + " (cut)" if isinstance(v, str) and len(v) > MAX_TEXT else v for k, v in record.items()}


def _well_formed(record: dict) -> bool:
    if "event" not in record:
        return False
    for name, types in FIELD_TYPES.items():
        value = record.get(name)
        if name in record and (isinstance(value, bool) or not isinstance(value, types)):
            return False
    return "time" not in record or math.isfinite(record["time"])


RECENT = 1000  # events an EventLog keeps in memory; a run's whole history is its file


class EventLog:
    def __init__(self, path: Optional[Path], clock=time.time) -> None:
        self._path = path
        self._clock = clock
        self.recorded: list[dict[str, Any]] = []  # the last RECENT events, for tests: the run reads events.jsonl

    def emit(self, event: str, **fields: Any) -> None:
        record = {"time": round(self._clock(), 3), "event": event, **fields}
        self.recorded.append(record)
        if len(self.recorded) > RECENT:
            del self.recorded[0]
        log.info("%s %s", event, " ".join(f"{k}={v}" for k, v in fields.items()))
        if self._path is not None:
            with open(self._path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
