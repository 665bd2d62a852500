"""One run, one owner (rlrun/run/runlock.py), with real processes: a second `rlrun resume` (or `train`)
of a run another process owns exits 4 at once and changes no file; the kernel frees the run when
its owner dies, even by SIGKILL and with a child of it still alive; a pid in state.json that now
belongs to some other process neither blocks a resume nor makes `status` say running."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rlrun.run import launch, runlock
from rlrun.config import compose
from rlrun.run.built import build
from rlrun.rundir import RunDir

pytestmark = pytest.mark.timeout(120)

# Owns the run at argv[1], starts `sleep` with every descriptor it may pass (close_fds=False: the
# worst a spawner could do), says "owned <its pid> <sleep's pid>", then waits to be killed.
OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from rlrun.run import runlock
    from rlrun.rundir import RunDir
    lock = runlock.acquire(RunDir(Path(sys.argv[1])))
    child = subprocess.Popen(["sleep", "300"], close_fds=False)
    print("owned", __import__("os").getpid(), child.pid, flush=True)
    time.sleep(300)
    """
)


def files(root: Path) -> dict[str, tuple]:
    """Every path under `root`: type, mode, size, mtime and a hash of its bytes."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
        out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def resumable(tmp_path) -> RunDir:
    cfg, resolved = compose(["trainer.max_train_steps=8"])
    run_dir = launch.create_run(build(cfg), resolved, [], root=tmp_path / "run")
    (run_dir.redis_dir / "appendonly.aof").write_text("")  # Redis data: resumable
    # What an rlrun without run locks would have met next, had it gone on: cheap to fail there
    # (preflight, exit 3) instead of starting Redis and vLLM.
    config = yaml.safe_load(run_dir.config.read_text())
    config["streams"]["server"] = "/nonexistent/redis-server"
    run_dir.config.write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir


@pytest.fixture
def owner():
    """Start OWNER on a run directory; (its pid, its child's pid). Killed at the end."""
    started: list[subprocess.Popen] = []
    children: list[int] = []

    def start(root: Path) -> tuple[int, int]:
        proc = subprocess.Popen([sys.executable, "-c", OWNER, str(root)], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        word, pid, child = proc.stdout.readline().split()
        assert word == "owned" and int(pid) == proc.pid
        children.append(int(child))
        return proc.pid, int(child)

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def rlrun(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rlrun", *args], capture_output=True, text=True, timeout=90)
    return done, time.monotonic() - started


def test_a_second_resume_exits_4_at_once_naming_the_owner_and_changes_nothing(resumable, owner):
    pid, _ = owner(resumable.root)
    before = files(resumable.root)
    done, seconds = rlrun("resume", str(resumable.root), "trainer.max_train_steps=80")
    print(f"refused resume took {seconds:.2f} s (the interpreter's start and imports included)")
    assert done.returncode == 4, done.stderr
    message = " ".join(done.stderr.split())
    assert f"is being run right now by rlrun (pid {pid})" in message and f"kill {pid}" in message, message
    assert "Traceback" not in done.stderr and message.count("error:") == 1
    assert files(resumable.root) == before  # config.yaml, overrides.yaml, state.json, no launch folder: all as they were


def test_a_second_train_into_a_directory_being_created_exits_4(tmp_path, owner):
    root = tmp_path / "new-run"
    root.mkdir(mode=0o700)
    pid, _ = owner(root)  # another `rlrun train run.dir=...` got here first (its lock file only, so far)
    before = files(root)
    done, _ = rlrun("train", f"run.dir={root}")
    assert done.returncode == 4, done.stderr
    assert f"is being run right now by rlrun (pid {pid})" in " ".join(done.stderr.split())
    assert files(root) == before


def test_the_kernel_frees_the_run_when_its_owner_is_killed_even_with_a_child_alive(resumable, owner):
    pid, child = owner(resumable.root)
    assert runlock.holder(resumable) == runlock.Holder(pid)
    os.kill(pid, signal.SIGKILL)  # not reaped yet: the kernel closes a dying process's files before that
    deadline = time.monotonic() + 30
    while runlock.holder(resumable) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(child, 0)  # the child it started lives on (it holds no descriptor of the lock: close-on-exec)
    assert runlock.holder(resumable) is None
    with runlock.acquire(resumable) as lock:  # and the run can be owned again at once
        assert lock.held and runlock.holder(resumable) is not None


@pytest.mark.parametrize("pid", [1, os.getpid()], ids=["pid-1", "a-live-pid-not-rlrun"])
def test_a_reused_pid_in_state_json_neither_blocks_resume_nor_reads_as_running(resumable, pid):
    """state.json says running, with the pid of a live process that is not rlrun (pid reuse after a
    crash or a reboot): nobody holds the run's lock, so it is not running."""
    from rlrun.run import resume as resuming
    from rlrun.cli import status as run_status

    config = yaml.safe_load(resumable.config.read_text())
    config["streams"]["server"] = "auto"
    resumable.config.write_text(yaml.safe_dump(config, sort_keys=False))
    resumable.write_state(status="running", supervisor_pid=pid)
    report = run_status.report(resumable)
    assert report["live"] is False and report["status"].startswith("running (supervisor gone")
    with resuming.owned(resumable.root):
        plan = resuming.plan_resume(resumable.root, [])
    assert plan.built.cfg.trainer.max_train_steps == 8 and not plan.already_finished
