"""Stack dumps before kills, with real processes: a stalled process's file names the function it
was stuck in, with py-spy and with the SIGUSR1 fallback; a stop that escalates to SIGKILL dumps
first; a dump that hangs does not hold up the kill."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

from rlrun.supervisor import EventLog, ProcessSpec, RunVerdict, Supervisor
from rlrun.supervisor.diagnostics import Diagnoser, find_py_spy
from rlrun.supervisor.policy import RestartPolicy

# Stands in for a role: installs rlrun's SIGUSR1 dump, says it is up, then hangs in a named function.
HANGING_ROLE = textwrap.dedent(
    """
    import signal, sys, time
    from rlrun.telemetry import stackdump
    stackdump.enable()
    signal.signal(signal.SIGTERM, lambda *_: None)  # a stop has to escalate to SIGKILL
    def waiting_for_a_lock_that_never_comes():
        print("up", flush=True)
        while True:
            time.sleep(0.05)
    waiting_for_a_lock_that_never_comes()
    """
)


def hanging_spec(tmp_path: Path, **kwargs) -> ProcessSpec:
    return ProcessSpec(
        "hanger", [sys.executable, "-c", HANGING_ROLE], tmp_path / "hanger.log",
        env={"PYTHONPATH": os.pathsep.join(sys.path)}, **kwargs,
    )  # fmt: skip


def wait_for_log(path: Path, text: str, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert time.time() < deadline, f"{path} never said {text!r}"
        time.sleep(0.05)


def stall_once(tmp_path: Path, diagnoser: Diagnoser) -> list[dict]:
    """Run the hanging role until the watchdog has declared it stalled and restarted it."""
    spec = hanging_spec(tmp_path, alive=lambda pid: False, stall_timeout_s=0.5, restart=RestartPolicy(backoff_initial_s=60, backoff_max_s=60))
    events = EventLog(tmp_path / "events.jsonl")
    sup = Supervisor([spec], events, poll_interval_s=0.1, diagnose=diagnoser.capture)
    try:
        sup.start_all()
        wait_for_log(tmp_path / "hanger.log", "up")
        deadline = time.time() + 30
        while not any(e["event"] == "process_failed" for e in events.recorded):
            assert time.time() < deadline, events.recorded
            sup.watch(lambda exits: RunVerdict(True, "one poll"))
    finally:
        sup.stop_all()
    return events.recorded


def test_a_stalled_process_is_dumped_with_py_spy_before_it_is_killed(tmp_path):
    assert find_py_spy() is not None, "py-spy is in the test extra: pip install 'rlrun[test]'"
    recorded = stall_once(tmp_path, Diagnoser(tmp_path / "diagnostics"))
    kinds = [e["event"] for e in recorded]
    assert kinds.index("process_stalled") < kinds.index("stack_dump") < kinds.index("process_failed")
    dump = next(e for e in recorded if e["event"] == "stack_dump")
    path = Path(dump["file"])
    assert path.parent == tmp_path / "diagnostics" and path.name.startswith("hanger-0-")
    text = path.read_text()
    assert "waiting_for_a_lock_that_never_comes" in text  # the function it hung in, from py-spy
    assert "py-spy dump" in text and "rss" in text and "cpu" in text
    assert "up" in text.split("## last", 1)[1]  # the log's last lines
    assert "stalled" in dump["reason"]


def test_without_py_spy_rlruns_own_processes_dump_their_stacks_on_sigusr1(tmp_path):
    recorded = stall_once(tmp_path, Diagnoser(tmp_path / "diagnostics", py_spy=""))
    text = Path(next(e for e in recorded if e["event"] == "stack_dump")["file"]).read_text()
    assert "SIGUSR1" in text and "(not installed)" in text
    tail = text.split("## last", 1)[1]
    assert "waiting_for_a_lock_that_never_comes" in tail  # faulthandler's dump, in the log's tail


def test_a_stop_that_escalates_to_sigkill_dumps_first(tmp_path):
    events = EventLog(tmp_path / "events.jsonl")
    sup = Supervisor([hanging_spec(tmp_path, stop_grace_s=0.5)], events, poll_interval_s=0.1, diagnose=Diagnoser(tmp_path / "d", py_spy="").capture)
    sup.start_all()
    wait_for_log(tmp_path / "hanger.log", "up")
    sup.stop_all()
    kinds = [e["event"] for e in events.recorded]
    assert kinds.index("stack_dump") < kinds.index("process_killed")
    assert "after SIGTERM" in events.recorded[kinds.index("stack_dump")]["reason"]


def test_a_dump_that_hangs_delays_the_kill_by_its_budget_only(tmp_path):
    # A "py-spy" that never answers: the capture gives up on it when the budget is spent.
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nsleep 60\n")
    fake.chmod(0o755)
    started = time.monotonic()
    path = Diagnoser(tmp_path / "d", budget_s=1.5, py_spy=str(fake)).capture("x", 0, [os.getpid()], None, "test")
    took = time.monotonic() - started
    assert took < 1.5 + 1.5, took  # the budget, the CPU sample and the SIGUSR1 wait (which is skipped: budget spent)
    assert "did not answer in time" in path.read_text()
    assert json.dumps(str(path))  # a path the event can carry
