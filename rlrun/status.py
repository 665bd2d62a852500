"""What `rlrun status` and `rlrun logs` read back from a run directory (running or finished).

The supervisor's events are the record: replaying them gives each process's last pid, state,
restarts and log file, without asking the (possibly dead) supervisor anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rlrun.errors import RunDirError
from rlrun.rundir import RunDir

# The state each supervisor event leaves a process in.
EVENT_STATES = {
    "process_started": "starting",
    "process_restarted": "starting",
    "process_ready": "ready",
    "process_exited": "exited",
    "process_failed": "failed",
    "process_stalled": "stalled",
    "process_stopping": "stopping",
    "process_killed": "stopping",
}


@dataclass
class ProcessRow:
    name: str
    pid: Optional[int] = None
    state: str = "pending"
    restarts: int = 0
    last_failure: str = ""
    log: str = ""
    since: Optional[float] = None  # time of the last state change
    last_dump: str = ""  # the diagnostics file of the last stack dump taken before a kill
    history: list[str] = field(default_factory=list)


def replay_events(events: list[dict]) -> list[ProcessRow]:
    """Each process's last known state, in start order. Pure: events in, rows out."""
    rows: dict[str, ProcessRow] = {}
    for event in events:
        name = event.get("process")
        kind = event.get("event")
        if name and kind == "stack_dump":
            rows.setdefault(name, ProcessRow(name)).last_dump = event.get("file") or ""
        if not name or kind not in EVENT_STATES:
            continue
        row = rows.setdefault(name, ProcessRow(name))
        row.state = EVENT_STATES[kind]
        row.since = event.get("time")
        row.history.append(kind)
        if kind in ("process_started", "process_restarted"):
            row.pid = event.get("pid")
            row.log = event.get("log", row.log)
        if kind == "process_restarted":
            row.restarts += 1
        if kind == "process_failed":
            row.last_failure = event.get("reason", "")
            if event.get("action") == "restart":
                row.state = "backoff"
    stopped = any(e.get("event") == "run_stopped" for e in events)
    for row in rows.values():
        if stopped and row.state in ("stopping", "ready", "starting", "backoff"):
            row.state = "stopped"
    return list(rows.values())


def load(run_dir: RunDir) -> tuple[dict, list[ProcessRow], Optional[dict]]:
    """(state.json, process rows, last metrics record) of a run directory."""
    if not run_dir.is_run():
        raise RunDirError(f"{run_dir.root} is not an rlrun run directory (no {run_dir.marker.name}). Give the directory `rlrun train` printed.")
    events = _read_jsonl(run_dir.events)
    metrics = _read_jsonl(run_dir.metrics)
    state = run_dir.read_state()
    if state.get("status") == "running" and run_dir.running_supervisor() is None:
        state["status"] = "running (supervisor gone: rlrun was killed; use `rlrun resume`)"
    return state, replay_events(events), (metrics[-1] if metrics else None)


def latest_log(run_dir: RunDir, process: str) -> Path:
    rows = {row.name: row for row in replay_events(_read_jsonl(run_dir.events))}
    if process not in rows:
        known = ", ".join(rows) or "none yet"
        raise RunDirError(f"no process named '{process}' in {run_dir.root}. Processes: {known}.")
    return Path(rows[process].log) if rows[process].log else run_dir.log(process)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
    return records
