"""The supervisor with real processes: own process groups, logs to files, no orphans after stop,
and children that die with their parent even when it is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from rlrun.errors import ProcessFailed
from rlrun.supervisor import EventLog, ProcessSpec, Supervisor

# A process that starts a grandchild in a *new session* (as some servers do), then sleeps.
ESCAPING_PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print("grandchild", child.pid, flush=True)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_children_get_their_own_group_log_to_file_and_are_all_stopped(tmp_path):
    specs = [
        ProcessSpec("sleeper", [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(600)"], tmp_path / "sleeper.log", stop_grace_s=2),
        ProcessSpec("escaper", [sys.executable, "-c", ESCAPING_PARENT], tmp_path / "escaper.log", stop_grace_s=2),
    ]
    sup = Supervisor(specs, EventLog(tmp_path / "events.jsonl"), poll_interval_s=0.1)
    sup.start_all()
    deadline = time.time() + 10
    while "grandchild" not in (tmp_path / "escaper.log").read_text() and time.time() < deadline:
        time.sleep(0.1)
    grandchild = int((tmp_path / "escaper.log").read_text().split()[1])
    for proc in sup.processes:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)  # its own process group
    sup.watch(lambda exits: (True, "done"))  # one poll records the descendants
    pids = [p.pid for p in sup.processes]
    sup.stop_all()
    time.sleep(0.2)
    assert not any(alive(pid) for pid in pids + [grandchild])
    assert "hello" in (tmp_path / "sleeper.log").read_text()
    events = (tmp_path / "events.jsonl").read_text()
    assert '"descendants_swept"' in events and str(grandchild) in events


def test_a_crashing_process_is_reported_with_its_log_tail(tmp_path):
    specs = [ProcessSpec("crasher", [sys.executable, "-c", "import sys; print('boom: bad thing'); sys.exit(3)"], tmp_path / "c.log")]
    sup = Supervisor(specs, EventLog(None), poll_interval_s=0.05)
    sup.start_all()
    with pytest.raises(ProcessFailed) as info:
        sup.watch(lambda exits: (False, "not yet"))
    sup.stop_all()
    assert "code 3" in str(info.value) and "boom: bad thing" in info.value.log_tail


def test_children_die_when_the_supervisor_is_sigkilled(tmp_path):
    program = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from rlrun.supervisor import EventLog, ProcessSpec, Supervisor
        specs = [ProcessSpec("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], Path({str(tmp_path)!r}) / "s.log")]
        sup = Supervisor(specs, EventLog(None), poll_interval_s=0.1)
        sup.start_all()
        print(sup.processes[0].pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    assert alive(child_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 5
    while alive(child_pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(child_pid)


@pytest.mark.parametrize("how, expected", [("sys.exit(7)", 7), ("os.kill(os.getpid(), signal.SIGKILL)", -9), ("os.kill(os.getpid(), signal.SIGTERM)", -15)])
def test_the_guard_reports_the_childs_own_exit_status(tmp_path, how, expected):
    """The supervisor must see a SIGKILLed child as killed by SIGKILL, not as the guard's exit."""
    program = f"import os, signal, sys; {how}"
    sup = Supervisor([ProcessSpec("p", [sys.executable, "-c", program], tmp_path / "p.log", finishes=True)], EventLog(None), poll_interval_s=0.05)
    sup.start_all()
    handle = sup.processes[0].handle
    deadline = time.time() + 10
    while handle.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    sup.stop_all()
    assert handle.poll() == expected


def test_a_process_crashing_at_every_start_spends_its_budget(tmp_path):
    from rlrun.errors import RestartsExhausted
    from rlrun.supervisor.policy import RestartPolicy

    policy = RestartPolicy(restart=True, max_restarts=2, window_s=60, backoff_initial_s=0.1, backoff_max_s=0.2)
    crasher = ProcessSpec("crasher", [sys.executable, "-c", "print('cannot start: no GPU'); raise SystemExit(1)"], tmp_path / "c.log", restart=policy)
    sup = Supervisor([crasher], EventLog(tmp_path / "events.jsonl"), poll_interval_s=0.05)
    with pytest.raises(RestartsExhausted) as info:
        sup.start_all()
        sup.watch(lambda exits: (False, "not yet"))
    sup.stop_all()
    assert info.value.exit_code == 6
    assert "2 restarts within 60 s used up" in str(info.value) and "cannot start: no GPU" in info.value.log_tail
    assert sorted(p.name for p in tmp_path.glob("c*.log")) == ["c.1.log", "c.2.log", "c.log"]
