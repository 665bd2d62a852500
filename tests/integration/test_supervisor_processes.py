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
from rlrun.supervisor import EventLog, ProcessSpec, RunVerdict, Supervisor
from tests.processes import ESCAPING_PARENT, alive
from tests.waiting import wait_until

# A process that starts a grandchild in a *new session* (as some servers do), then sleeps.
def test_children_get_their_own_group_log_to_file_and_are_all_stopped(tmp_path):
    specs = [
        ProcessSpec("sleeper", [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(600)"], tmp_path / "sleeper.log", stop_grace_s=2),
        ProcessSpec("escaper", [sys.executable, "-c", ESCAPING_PARENT], tmp_path / "escaper.log", stop_grace_s=2),
    ]
    sup = Supervisor(specs, EventLog(tmp_path / "events.jsonl"), poll_interval_s=0.1)
    sup.start_all()
    deadline = time.time() + 10
    while time.time() < deadline and not (
        "grandchild" in (tmp_path / "escaper.log").read_text() and "hello" in (tmp_path / "sleeper.log").read_text()
    ):  # both started (on a loaded machine a child's first line can take seconds)
        time.sleep(0.1)
    grandchild = int((tmp_path / "escaper.log").read_text().split()[1])
    for proc in sup.processes:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)  # its own process group
    sup.watch(lambda exits: RunVerdict(True, "done"))  # one poll records the descendants
    pids = [p.pid for p in sup.processes]
    sup.stop_all()
    wait_until(lambda: not [pid for pid in pids + [grandchild] if alive(pid)], 5, f"{pids} and {grandchild} to be gone")
    assert "hello" in (tmp_path / "sleeper.log").read_text()
    events = (tmp_path / "events.jsonl").read_text()
    assert '"descendants_swept"' in events and str(grandchild) in events


def test_a_crashing_process_is_reported_with_its_log_tail(tmp_path):
    specs = [ProcessSpec("crasher", [sys.executable, "-c", "import sys; print('boom: bad thing'); sys.exit(3)"], tmp_path / "c.log")]
    sup = Supervisor(specs, EventLog(None), poll_interval_s=0.05)
    sup.start_all()
    with pytest.raises(ProcessFailed) as info:
        sup.watch(lambda exits: RunVerdict(False, "not yet"))
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
        sup.watch(lambda exits: RunVerdict(False, "not yet"))
    sup.stop_all()
    assert info.value.exit_code == 6
    assert "2 restarts within 60 s used up" in str(info.value) and "cannot start: no GPU" in info.value.log_tail
    assert sorted(p.name for p in tmp_path.glob("c*.log")) == ["c.1.log", "c.2.log", "c.log"]


def test_the_shared_process_tree_finds_grandchildren_and_is_read_once_per_poll(tmp_path):
    from rlrun.supervisor.local import ProcessTree

    now = {"t": 0.0}
    tree = ProcessTree(max_age_s=0.25, clock=lambda: now["t"])
    parent = subprocess.Popen([sys.executable, "-c", ESCAPING_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(parent.stdout.readline().split()[1])
        assert grandchild in tree.descendants(os.getpid()) and parent.pid in tree.descendants(os.getpid())
        late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        assert late.pid not in tree.descendants(os.getpid())  # the same poll: the tree read before it
        now["t"] = 1.0
        assert late.pid in tree.descendants(os.getpid())  # the next poll reads /proc again
        late.kill()
        late.wait()
    finally:
        for pid in (grandchild, parent.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait()


def test_parents_are_read_right_whatever_a_process_calls_itself():
    """/proc/<pid>/stat holds the short name between parentheses, which may itself hold spaces
    and parentheses: the parent must still be read from the right field."""
    from rlrun.supervisor.local import parents

    title = "import setproctitle, time; setproctitle.setthreadtitle('a) 1 2 (b'); print('titled', flush=True); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", title], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "titled"
        assert psutil.Process(child.pid).name() == "a) 1 2 (b"
        found = parents()
        assert found[child.pid] == os.getpid()
        assert found[os.getpid()] == os.getppid()
    finally:
        child.kill()
        child.wait()


def test_the_vllm_health_probe_keeps_one_connection(tmp_path):
    import http.server
    import threading

    from rlrun.inference.server import HealthCheck

    peers = []

    class Health(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            peers.append(self.client_address)
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe = HealthCheck(f"http://127.0.0.1:{server.server_address[1]}")
        assert all(probe(1) for _ in range(5))
        assert len(set(peers)) == 1 and len(peers) == 5  # five polls, one connection
    finally:
        server.shutdown()
    assert HealthCheck("http://127.0.0.1:9")(1) is False  # nothing listening: no, never an exception


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to pin one process apart from another")
def test_a_pinned_process_and_everything_it_starts_run_on_its_cores_only(tmp_path):
    """world.cpu_affinity=auto as the spawner applies it: the guard pins before it starts the child,
    so the child's own children (vLLM's engine core and worker) inherit the cores."""
    from rlrun.supervisor.local import LocalSpawner

    first, second = sorted(os.sched_getaffinity(0))[:2]
    report = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)), subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True).stdout.strip(), flush=True)"
    spawner = LocalSpawner({"vllm-0": (first,), "": (second,)})
    handles = {name: spawner.spawn(ProcessSpec(name, [sys.executable, "-c", report], tmp_path / f"{name}.log")) for name in ("vllm-0", "trainer")}
    for handle in handles.values():
        assert psutil.Process(handle.pid).wait(30) == 0
    assert (tmp_path / "vllm-0.log").read_text().split() == [f"[{first}]", f"[{first}]"]
    assert (tmp_path / "trainer.log").read_text().split() == [f"[{second}]", f"[{second}]"]
