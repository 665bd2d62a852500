"""events.jsonl read as it grows (EventTail) gives what read_events gives; an EventLog keeps only its
last RECENT events in memory."""

from __future__ import annotations

import json

from rlrun.supervisor import events as ev
from rlrun.supervisor.events import EventLog, EventTail, read_events


def test_a_tail_reads_each_event_once_as_read_events_does_and_leaves_a_line_being_written(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []  # no file yet
    with open(path, "w") as handle:
        handle.write(json.dumps({"time": 1.0, "event": "run_started"}) + "\n")
        handle.write("not json\n" + json.dumps({"time": "x", "event": "bad"}) + "\n")  # skipped, as read_events skips them
        handle.write(json.dumps({"time": 2.0, "event": "process_failed", "reason": "r" * (ev.MAX_TEXT + 5)}) + "\n")
        handle.write('{"time": 3.0, "event": "process_re')  # being written
    first = tail.read()
    assert [e["event"] for e in first] == ["run_started", "process_failed"] and first[1]["reason"].endswith(" (cut)")
    with open(path, "a") as handle:
        handle.write('started"}\n' + json.dumps({"time": 4.0, "event": "run_stopped"}) + "\n")
    second = tail.read()
    assert [e["event"] for e in second] == ["process_restarted", "run_stopped"] and tail.read() == []
    assert first + second == read_events(path)


def test_an_event_log_keeps_its_last_recent_events_and_writes_them_all(tmp_path, monkeypatch):
    monkeypatch.setattr(ev, "RECENT", 5)
    log = EventLog(tmp_path / "events.jsonl", clock=lambda: 1.0)
    for i in range(12):
        log.emit("process_ready", process=f"p{i}")
    assert [e["process"] for e in log.recorded] == [f"p{i}" for i in range(7, 12)]
    assert len(read_events(tmp_path / "events.jsonl")) == 12
