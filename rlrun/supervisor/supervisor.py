"""The supervisor: start processes in order, watch them, decide nothing about RL, stop in order.

It is given process specs and a completion predicate; it starts each spec once the previous one
is ready, polls exits and the predicate, and stops everything in reverse order — SIGTERM to the
process group, a grace period, SIGKILL, then a sweep of any descendant that escaped its group.
The operating system (spawner, clock, sleep) is injected so the logic is tested with fakes.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from rlrun.errors import ProcessFailed
from rlrun.supervisor.events import EventLog
from rlrun.supervisor.local import Handle, LocalSpawner, Spawner, kill_pids
from rlrun.supervisor.spec import ProcessSpec, ProcessState

log = logging.getLogger(__name__)


@dataclass
class ProcessStatus:
    """What the supervisor knows of one process, as shown in the live view."""

    spec: ProcessSpec
    state: ProcessState = ProcessState.PENDING
    pid: Optional[int] = None
    started_at: Optional[float] = None
    exit_code: Optional[int] = None
    handle: Optional[Handle] = field(default=None, repr=False)
    known_descendants: set[int] = field(default_factory=set, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name


# The completion predicate: given the exit codes so far (None while running), is the run done?
# It returns (finished, reason).
CompletionCheck = Callable[[dict[str, Optional[int]]], tuple[bool, str]]
Tick = Callable[[list[ProcessStatus]], None]


class Supervisor:
    def __init__(
        self,
        specs: list[ProcessSpec],
        events: EventLog,
        *,
        spawner: Optional[Spawner] = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = 0.5,
        on_tick: Optional[Tick] = None,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique: {names}")
        self.processes = [ProcessStatus(spec) for spec in specs]
        self._events = events
        self._spawner = spawner or LocalSpawner()
        self._clock = clock
        self._sleep = sleep
        self._poll = poll_interval_s
        self._on_tick = on_tick or (lambda _: None)

    # --- the three phases ----------------------------------------------------------------------
    def start_all(self) -> None:
        """Start every process in order, each gated on the readiness of the one before."""
        for proc in self.processes:
            self._start(proc)
            self._wait_ready(proc)

    def watch(self, is_finished: CompletionCheck) -> str:
        """Poll until the completion predicate says done; raise ProcessFailed on a failure."""
        while True:
            self._reap()
            for proc in self.processes:
                if proc.state is ProcessState.FAILED:
                    raise self._failure(proc, f"exited with {describe_exit(proc.exit_code)}")
            finished, reason = is_finished({p.name: p.exit_code for p in self.processes})
            if finished:
                self._events.emit("run_finished", reason=reason)
                return reason
            self._on_tick(self.processes)
            self._sleep(self._poll)

    def stop_all(self) -> None:
        """Stop everything in reverse start order; nothing of the run is left afterwards."""
        for proc in reversed(self.processes):
            self._stop(proc)

    # --- one process ---------------------------------------------------------------------------
    def _start(self, proc: ProcessStatus) -> None:
        proc.handle = self._spawner.spawn(proc.spec)
        proc.pid = proc.handle.pid
        proc.started_at = self._clock()
        proc.state = ProcessState.STARTING
        self._events.emit("process_started", process=proc.name, pid=proc.pid, log=str(proc.spec.log_path))

    def _wait_ready(self, proc: ProcessStatus) -> None:
        probe = proc.spec.ready
        deadline = self._clock() + proc.spec.ready_timeout_s
        while True:
            self._reap_one(proc)
            if proc.state is ProcessState.FAILED or proc.state is ProcessState.EXITED:
                # A dead process fails fast, not after the readiness timeout.
                raise self._failure(proc, f"exited with {describe_exit(proc.exit_code)} before it was ready")
            if probe is None or probe():
                proc.state = ProcessState.READY
                self._events.emit("process_ready", process=proc.name, after_s=round(self._clock() - proc.started_at, 2))
                return
            if self._clock() > deadline:
                proc.state = ProcessState.FAILED
                raise self._failure(proc, f"was not ready within {proc.spec.ready_timeout_s:.0f} s")
            self._on_tick(self.processes)
            self._sleep(self._poll)

    def _reap(self) -> None:
        for proc in self.processes:
            self._reap_one(proc)

    def _reap_one(self, proc: ProcessStatus) -> None:
        if proc.handle is None or proc.state not in (ProcessState.STARTING, ProcessState.READY):
            return
        proc.known_descendants.update(proc.handle.descendants())
        code = proc.handle.poll()
        if code is None:
            return
        proc.exit_code = code
        expected = code == 0 and proc.spec.finishes
        proc.state = ProcessState.EXITED if expected else ProcessState.FAILED
        self._events.emit("process_exited", process=proc.name, exit=describe_exit(code), expected=expected)

    def _stop(self, proc: ProcessStatus) -> None:
        if proc.handle is None:
            return
        if proc.state in (ProcessState.STARTING, ProcessState.READY):
            proc.known_descendants.update(proc.handle.descendants())
            proc.state = ProcessState.STOPPING
            self._events.emit("process_stopping", process=proc.name, signal="SIGTERM")
            proc.handle.signal_group(signal.SIGTERM)
            deadline = self._clock() + proc.spec.stop_grace_s
            while proc.handle.poll() is None and self._clock() < deadline:
                self._sleep(0.05)
            if proc.handle.poll() is None:
                self._events.emit("process_killed", process=proc.name, signal="SIGKILL", after_grace_s=proc.spec.stop_grace_s)
                proc.handle.signal_group(signal.SIGKILL)
                while proc.handle.poll() is None:
                    self._sleep(0.05)
            proc.exit_code = proc.handle.poll()
            proc.state = ProcessState.STOPPED
        # Descendants that left the group (or outlived a crashed parent) are swept even when the
        # process itself had already exited.
        proc.handle.signal_group(signal.SIGKILL)
        swept = kill_pids(sorted(proc.known_descendants))
        if swept:
            self._events.emit("descendants_swept", process=proc.name, pids=swept)

    def _failure(self, proc: ProcessStatus, what: str) -> ProcessFailed:
        self._events.emit("process_failed", process=proc.name, reason=what)
        tail = log_tail(proc.spec.log_path)
        hint = " It may have been killed by the OOM killer." if proc.exit_code == -signal.SIGKILL else ""
        return ProcessFailed(
            f"process '{proc.name}' {what}.{hint} Its log: {proc.spec.log_path}", process=proc.name, log_tail=tail
        )


def describe_exit(code: Optional[int]) -> str:
    """'code 1', 'signal SIGKILL' — as a person wants to read it."""
    if code is None:
        return "no exit yet"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 16_384))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
