"""Stack dumps of a process before the supervisor kills it: what a hung process was doing.

`diagnostics/<process>-<attempt>-<time>.txt`: each process's command line, state, CPU, memory and
threads, their Python stacks (`py-spy dump`, else SIGUSR1 to rlrun's own) and the log's tail. One
time budget for all of it, and nothing raises: a failed dump never keeps a hung process alive.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rlrun.supervisor.supervisor import log_tail


def write_report(folder: Path, name: str, reason: str, state: dict, clock=time.time) -> Optional[Path]:
    """`diagnostics/<name>-<time>.txt`: why, and `state` (plain data, as YAML); None when it could
    not be written. For what no process's stack shows (a stalled run's back-pressure)."""
    import yaml

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock()))
    text = f"# rlrun diagnostics: {name}\nreason: {reason}\ntime: {stamp}\n\n" + yaml.safe_dump(
        state, sort_keys=False, default_flow_style=False
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path, n = folder / f"{name}-{stamp}.txt", 1
        while path.exists():
            n += 1
            path = folder / f"{name}-{stamp}-{n}.txt"
        path.write_text(text)
    except OSError:
        return None
    return path


LOG_LINES = 40
CPU_SAMPLE_S = 0.2


def find_py_spy() -> Optional[str]:
    """The py-spy binary: on PATH, or next to this Python (a virtual environment's bin/)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


@dataclass(frozen=True)
class Diagnoser:
    """Writes one diagnostics file per call into `folder` (created on first use)."""

    folder: Path
    budget_s: float = 5.0  # at most this long for all the dumps of one capture
    py_spy: Optional[str] = None  # the py-spy binary; None: find it; "" : do not use it
    clock = staticmethod(time.time)

    def capture(
        self, process: str, attempt: int, pids: list[int], log_path: Optional[Path], reason: str
    ) -> Optional[Path]:
        """Dump `pids` (group leader first) into a new file; None when not even that could be written."""
        deadline = time.monotonic() + self.budget_s
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.clock()))
        lines = [f"# rlrun diagnostics: {process} attempt {attempt}", f"reason: {reason}", f"time: {stamp}", ""]
        lines += ["## processes", *_process_table(pids), ""]
        py_spy = find_py_spy() if self.py_spy is None else (self.py_spy or None)
        dumped = _py_spy_stacks(py_spy, pids, deadline, lines) if py_spy else 0
        if not dumped:
            lines.append(
                "py-spy gave no stack"
                + ("" if py_spy else " (not installed)")
                + ": asking rlrun's own processes (SIGUSR1)"
            )
            _signal_dumps(pids, log_path, deadline, lines)
        tail = log_tail(log_path, LOG_LINES) if log_path else ""
        lines += ["", f"## last {LOG_LINES} lines of {log_path}", tail or "(no log)"]
        path = self.folder / f"{process}-{attempt}-{stamp}.txt"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            n = 1
            while path.exists():  # two captures within a second: keep both
                n += 1
                path = self.folder / f"{process}-{attempt}-{stamp}-{n}.txt"
            path.write_text("\n".join(lines) + "\n")
        except OSError:
            return None
        return path


def _process_table(pids: list[int]) -> list[str]:
    import psutil

    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.cpu_percent(None)  # starts the short sample below
            procs.append(proc)
        except psutil.Error:
            procs.append(None)
    time.sleep(CPU_SAMPLE_S)
    rows = []
    for pid, proc in zip(pids, procs):
        if proc is None:
            rows.append(f"pid {pid}: gone")
            continue
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                age = max(time.time() - proc.create_time(), 1e-6)
                rows.append(
                    f"pid {pid} [{proc.status()}] cpu {proc.cpu_percent(None):.0f}% now, "
                    f"{100 * (times.user + times.system) / age:.0f}% on average over {age:.0f} s; "
                    f"rss {proc.memory_info().rss / 2**20:.0f} MiB; threads {proc.num_threads()}; "
                    f"{' '.join(proc.cmdline())[:300]}"
                )
        except psutil.Error as exc:
            rows.append(f"pid {pid}: {type(exc).__name__}")
    return rows


def _py_spy_stacks(py_spy: str, pids: list[int], deadline: float, lines: list[str]) -> int:
    ok = 0
    lines.append("## Python stacks (py-spy dump)")
    for pid in pids:
        # First with native frames (py-spy stops the process briefly); a process that cannot be
        # stopped (frozen by SIGSTOP, or ptrace refused) is read as it is, without native frames.
        for extra in (["--native"], ["--nonblocking"]):
            out = _run([py_spy, "dump", "--pid", str(pid), *extra], deadline)
            if out is None:
                lines.append(f"pid {pid}: py-spy did not answer in time")
                break
            code, text = out
            if code == 0:
                lines += [text.rstrip(), ""]
                ok += 1
                break
            if "python version" in text.lower() or "no such process" in text.lower():
                lines.append(f"pid {pid}: not a Python process (or gone)")
                break
        else:
            lines.append(f"pid {pid}: py-spy failed: {text.strip().splitlines()[0] if text.strip() else code}")
    return ok


def _signal_dumps(pids: list[int], log_path: Optional[Path], deadline: float, lines: list[str]) -> None:
    asked = []
    for pid in pids:
        # Only a process that catches SIGUSR1 is sent it (its default action ends the process):
        # rlrun's roles do, through `rlrun.telemetry.stackdump.enable`; the guards do not.
        if catches(pid, signal.SIGUSR1):
            try:
                os.kill(pid, signal.SIGUSR1)
                asked.append(pid)
            except OSError:
                continue
    if not asked:
        lines.append("no process catches SIGUSR1: no stacks")
        return
    lines.append(f"sent SIGUSR1 to {asked}: their stacks follow in the log's tail below")
    # faulthandler writes at once from its signal handler; give it a moment (a frozen process never will).
    size = _size(log_path)
    wait_until = min(deadline, time.monotonic() + 1.0)
    while time.monotonic() < wait_until:
        time.sleep(0.05)
        if _size(log_path) != size:
            time.sleep(0.1)  # let it finish the dump
            break


def catches(pid: int, sig: int) -> bool:
    """True when process `pid` has a handler for `sig` (Linux: the SigCgt mask of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _run(argv: list[str], deadline: float) -> Optional[tuple[int, str]]:
    remaining = deadline - time.monotonic()
    if remaining <= 0.05:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=remaining, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    except OSError as exc:
        return 1, str(exc)
    return done.returncode, done.stdout + done.stderr


def _size(path: Optional[Path]) -> int:
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0
