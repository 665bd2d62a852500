"""The node agent as plain Python (no Ray): it starts a process under two guards in a group of
its own, reports its exit like the local spawner, sweeps descendants that left the group, reads
log tails, and a process dies with its agent even when the outer guard is SIGKILLed (what Ray
does to an exiting worker's children)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from rlrun.cluster.agent import NodeAgent
from tests.processes import ESCAPING_PARENT, alive

def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_exit_status_signals_and_sweep(tmp_path):
    agent = NodeAgent()
    log = tmp_path / "logs" / "p.log"
    pid = agent.spawn([sys.executable, "-c", ESCAPING_PARENT], str(log), {"SECRET": "x"})
    assert os.getpgid(pid) == pid != os.getpgid(0)
    wait_for(lambda: "grandchild" in log.read_text())
    grandchild = int(log.read_text().split()[1])
    assert agent.poll(pid) is None
    assert grandchild in agent.descendants(pid)  # recorded although it left the group

    agent.signal_group(pid, signal.SIGKILL)  # the group, and the descendants seen: a sweep
    wait_for(lambda: agent.poll(pid) is not None)
    assert agent.poll(pid) == -signal.SIGKILL
    wait_for(lambda: not alive(grandchild))

    done = agent.spawn([sys.executable, "-c", "raise SystemExit(3)"], str(log), {})
    wait_for(lambda: agent.poll(done) is not None)
    assert agent.poll(done) == 3  # the exit code passes through both guards


def test_the_group_dies_when_the_outer_guard_is_sigkilled(tmp_path):
    agent = NodeAgent()
    pid = agent.spawn([sys.executable, "-c", "import time; time.sleep(600)"], str(tmp_path / "p.log"), {})
    wait_for(lambda: len(psutil.Process(pid).children(recursive=True)) == 2)
    members = [p.pid for p in psutil.Process(pid).children(recursive=True)]  # inner guard, the process
    os.kill(pid, signal.SIGKILL)  # what Ray does to the direct children of a worker that exits
    wait_for(lambda: not any(alive(m) for m in members), timeout=10)


def test_the_group_dies_with_its_agent(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(os.getcwd())!r})
        from rlrun.cluster.agent import NodeAgent
        pid = NodeAgent().spawn([sys.executable, "-c", "import time; time.sleep(600)"], {str(tmp_path / 'p.log')!r}, {{}})
        print(pid, flush=True)
        time.sleep(600)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(holder.stdout.readline())
    wait_for(lambda: len(psutil.Process(pid).children(recursive=True)) == 2)
    members = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    holder.kill()  # the agent's process dies (its node, or its driver, is gone)
    holder.wait()
    wait_for(lambda: not any(alive(m) for m in members), timeout=10)
