"""Helpers for end-to-end tests: run the real `rlrun` CLI and find what it left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

class RunProcesses:
    """Every process that descends from one `rlrun` process, collected while it runs.

    "No process of the run is left" is checked against this set (pid + start time), so the check
    is exact and unaffected by anything else running on the machine.
    """

    def __init__(self, root_pid: int) -> None:
        import threading

        self.seen: set[tuple[int, float]] = set()
        self.cmdlines: set[tuple[str, ...]] = set()  # every command line `ps` showed, while they ran
        self._root = root_pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        while not self._stop.is_set():
            try:
                for proc in psutil.Process(self._root).children(recursive=True):
                    try:
                        self.seen.add((proc.pid, proc.create_time()))
                        self.cmdlines.add(tuple(proc.cmdline()))
                    except psutil.Error:
                        pass
            except psutil.Error:
                return
            self._stop.wait(0.3)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def alive(self) -> list[str]:
        left = []
        for pid, started in self.seen:
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid}: {' '.join(proc.cmdline())[:120]}")
            except psutil.Error:
                pass
        return left


def run_cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run `rlrun ARGS` to its end; `.left_behind` lists its descendants still alive after it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlrun", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    tracker = RunProcesses(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        tracker.stop()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    result.left_behind = tracker.alive()
    result.cmdlines = sorted(tracker.cmdlines)
    return result


def start_rlrun(run_dir: Path, *args: str, command: str = "train", env: dict | None = None) -> subprocess.Popen:
    """Start `rlrun train run.dir=RUN ARGS` (or `rlrun resume RUN ARGS`) in the background.

    Its output goes to RUN/../rlrun.out; `.run_processes` tracks its descendants."""
    log = open(run_dir.parent / "rlrun.out", "a")
    argv = ["train", f"run.dir={run_dir}", *args] if command == "train" else ["resume", str(run_dir), *args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlrun", *argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    proc.run_processes = RunProcesses(proc.pid)
    return proc


def left_behind(proc: subprocess.Popen, grace_s: float = 5.0) -> list[str]:
    """Descendants of a finished (or killed) rlrun still alive after `grace_s`."""
    import time

    proc.run_processes.stop()
    deadline = time.time() + grace_s
    while proc.run_processes.alive() and time.time() < deadline:
        time.sleep(0.2)
    return proc.run_processes.alive()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def leaked_secrets(run_dir: Path, cmdlines, outputs: tuple[str, ...] = ()) -> list[str]:
    """Where the run's Redis password or vLLM API key shows up: in a command line one of its
    processes had, in a file of the run (other than secrets/ and the 0600 redis.conf, which exist
    to hold them), or in the given outputs (rlrun's stdout/stderr)."""
    secrets = {
        "Redis password": (run_dir / "secrets" / "redis.password").read_text().strip(),
        "vLLM API key": (run_dir / "secrets" / "vllm.key").read_text().strip(),
    }
    assert all(len(value) >= 16 for value in secrets.values()), "the run has no generated secrets"
    private = {run_dir / "secrets", run_dir / "redis" / "redis.conf"}
    found = []
    for name, value in secrets.items():
        found += [f"{name} on the command line {' '.join(c)[:100]}" for c in cmdlines if value in " ".join(c)]
        found += [f"{name} in rlrun's output" for text in outputs if value in text]
        for path in run_dir.rglob("*"):
            if path.is_file() and not any(p == path or p in path.parents for p in private):
                if value.encode() in path.read_bytes():
                    found.append(f"{name} in {path.relative_to(run_dir)}")
    return found

