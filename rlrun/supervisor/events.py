"""Structured supervisor events, one JSON object a line in the run's `events.jsonl`."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

from rlrun.rundir import read_jsonl as read_events  # noqa: F401 - the events of an events.jsonl

log = logging.getLogger(__name__)


class EventLog:
    def __init__(self, path: Optional[Path], clock=time.time) -> None:
        self._path = path
        self._clock = clock
        self.recorded: list[dict[str, Any]] = []  # kept in memory too: tests and the live view read it

    def emit(self, event: str, **fields: Any) -> None:
        record = {"time": round(self._clock(), 3), "event": event, **fields}
        self.recorded.append(record)
        log.info("%s %s", event, " ".join(f"{k}={v}" for k, v in fields.items()))
        if self._path is not None:
            with open(self._path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
