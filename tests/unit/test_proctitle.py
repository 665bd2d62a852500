"""A role names its process: `ps` shows rlrun:<role> and its arguments."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

SCRIPT = "from rlrun.telemetry import proctitle; proctitle.name('actor'); import sys; print('named', flush=True); sys.stdin.read()"


def test_a_role_is_titled_rlrun_role_with_its_arguments():
    child = subprocess.Popen([sys.executable, "-c", SCRIPT, "--run-dir", "/tmp/r"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "named"
        deadline = time.time() + 5
        while "rlrun:actor" not in " ".join(psutil.Process(child.pid).cmdline()) and time.time() < deadline:
            time.sleep(0.05)
        assert " ".join(psutil.Process(child.pid).cmdline()).startswith("rlrun:actor --run-dir /tmp/r")
        assert psutil.Process(child.pid).name() == "rlrun:actor"  # no space in /proc/<pid>/stat's name field
    finally:
        child.stdin.close()
        child.wait(timeout=10)
