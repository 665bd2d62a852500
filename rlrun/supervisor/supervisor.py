"""The supervisor: start processes in dependency order, watch them, restart what fails, stop in order.

Given process specs and a completion check, it knows nothing about RL. Each process goes through

    pending → starting → ready → exited            (a finishing role's exit 0)
                 │          └──→ failed/stalled → backoff → starting (restart, per its policy)
                 └─ (dies or not ready in time) ─┘
    any → stopping → stopped                        (orderly stop, reverse start order)

each transition an event. The spawner, clock and sleep are injected: the logic is tested with fakes.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from rlrun.errors import ProcessFailed, RestartsExhausted
from rlrun.supervisor.events import EventLog
from rlrun.supervisor.local import Handle, LocalSpawner, Spawner, kill_pids
from rlrun.supervisor.policy import ExitInfo, ExitKind, RestartTracker, classify_exit
from rlrun.supervisor.spec import ProcessSpec, ProcessState
from rlrun.supervisor.stall import ProgressClock, ProgressWatch

log = logging.getLogger(__name__)

# A process still there this long after SIGKILL (stuck in the kernel, or on a node that no longer
# answers) is reported and left behind: waiting for it forever would hang the run's stop.
KILL_WAIT_S = 10.0


@dataclass
class ProcessStatus:
    """What the supervisor knows of one process, as shown in the live view."""

    spec: ProcessSpec
    tracker: RestartTracker
    state: ProcessState = ProcessState.PENDING
    pid: Optional[int] = None
    attempt: int = 0  # 0 for the first start, n for the n-th restart
    started_at: Optional[float] = None
    last_alive: Optional[float] = None  # when the liveness probe last said yes
    restart_at: Optional[float] = None
    exit_code: Optional[int] = None
    last_failure: str = ""
    last_dump: Optional[Path] = None  # the diagnostics file of the last stack dump taken before a kill
    handle: Optional[Handle] = field(default=None, repr=False)
    known_descendants: set[int] = field(default_factory=set, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def log_path(self) -> Path:
        """logs/vllm-0.log for the first start, logs/vllm-0.1.log for the first restart, ..."""
        base = self.spec.log_path
        return base if self.attempt == 0 else base.with_name(f"{base.stem}.{self.attempt}{base.suffix}")


@dataclass(frozen=True)
class RunVerdict:
    """A completion check's answer: finished or not, and why (one line). `reject` names a process
    that exited 0 before its work was done: that exit is a crash, restarted per its policy."""

    finished: bool
    reason: str
    reject: Optional[str] = None


# The completion check: given the exit codes of processes that exited (None otherwise), a verdict.
CompletionCheck = Callable[[dict[str, Optional[int]]], RunVerdict]
Tick = Callable[[list[ProcessStatus]], None]
# Before a kill for a stall (or a SIGKILL after the stop grace): (process, attempt, pids, log,
# reason) -> the diagnostics file written, or None. Must be bounded in time and never raise.
Diagnose = Callable[[str, int, list[int], Path, str], Optional[Path]]


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
        diagnose: Optional[Diagnose] = None,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique: {names}")
        self.processes = [ProcessStatus(spec, RestartTracker(spec.restart)) for spec in specs]
        self._after = {s.name: names[:i] if s.after is None else s.after for i, s in enumerate(specs)}
        unknown = {n for after in self._after.values() for n in after} - set(names)
        if unknown:
            raise ValueError(f"`after` names processes that are not in the run: {sorted(unknown)}")
        self._events = events
        self._spawner = spawner or LocalSpawner()
        self._clock = clock
        self._sleep = sleep
        self._poll = poll_interval_s
        self._on_tick = on_tick or (lambda _: None)
        self._diagnose = diagnose

    def status(self, name: str) -> ProcessStatus:
        return next(p for p in self.processes if p.name == name)

    def start_all(self) -> None:
        """Start every process once those it comes after (`spec.after`) are ready; return when all
        are ready or done. A failing first start follows its restart policy like any failure."""
        pending = list(self.processes)
        while True:
            for proc in [p for p in pending if self._may_start(p)]:
                pending.remove(proc)
                self._spawn(proc)
            now = self._clock()
            for proc in self.processes:
                self._advance(proc, now)
            if not pending and all(p.state in (ProcessState.READY, ProcessState.EXITED) for p in self.processes):
                return
            if not any(self._may_start(p) for p in pending):
                self._on_tick(self.processes)
                self._sleep(self._poll)

    def _may_start(self, proc: ProcessStatus) -> bool:
        return all(
            self.status(name).state in (ProcessState.READY, ProcessState.EXITED) for name in self._after[proc.name]
        )

    def watch(self, is_finished: CompletionCheck, progress: Optional[ProgressWatch] = None) -> str:
        """Watch and restart until the completion check says done; with `progress`, a run that
        makes none for its timeout while every process is alive has stalled (`_run_stalled`).
        ProcessFailed when a failure is not restarted, RestartsExhausted past a restart budget."""
        clock = ProgressClock(progress.timeout_s, self._clock()) if progress is not None else None
        while True:
            now = self._clock()
            for proc in self.processes:
                self._advance(proc, now)
            if clock is not None and progress is not None:
                quiet = clock.observe(progress.marker(), self._all_alive(now), now)
                if quiet is not None:
                    self._run_stalled(progress, clock.last, quiet, now)
                    clock.restart(self._clock())
                    continue
            done = {p.name: p.exit_code if p.state is ProcessState.EXITED else None for p in self.processes}
            verdict = is_finished(done)
            if verdict.reject is not None:  # treated as a failure: restarted per its policy
                proc = self.status(verdict.reject)
                info = ExitInfo(
                    ExitKind.CRASH, proc.exit_code, f"exited with code 0 before its work was done ({verdict.reason})"
                )
                self._fail(proc, info, now, info.description)
                continue
            if verdict.finished:
                self._events.emit("run_finished", reason=verdict.reason)
                return verdict.reason
            self._on_tick(self.processes)
            self._sleep(self._poll)

    def _all_alive(self, now: float) -> bool:
        """Every process ready (its liveness probe passed at this poll) or done."""
        return all(
            p.state is ProcessState.EXITED
            or (p.state is ProcessState.READY and (p.spec.alive is None or p.last_alive == now))
            for p in self.processes
        )

    def _run_stalled(self, watch: ProgressWatch, marker, quiet: float, now: float) -> None:
        """The run's state written (`watch.report`), then each suspect dumped and restarted as for a
        stall of its own, within its restart budget: RestartsExhausted (exit 6) once that is spent."""
        why = f"the run made no progress for {quiet:.0f} s while every process was alive ({watch.setting}={watch.timeout_s:g})"
        report = watch.report(why)
        suspects = [self.status(name) for name in watch.suspects if self.status(name).state is ProcessState.READY]
        self._events.emit(
            "run_stalled",
            quiet_s=round(quiet, 1),
            progress=str(marker),
            report=str(report) if report else None,
            restarting=[p.name for p in suspects],
        )
        log.error("%s; restarting %s (state: %s)", why, ", ".join(p.name for p in suspects) or "nothing", report)
        for proc in suspects:
            self._kill_stuck(proc, ExitInfo(ExitKind.STALLED, None, f"stalled: {why}"), now)

    def stop_all(self) -> None:
        """Stop everything in reverse start order, those marked `stop_first` before the rest;
        nothing of the run is left afterwards."""
        in_order = sorted(reversed(self.processes), key=lambda proc: not proc.spec.stop_first)
        for proc in in_order:
            self._stop(proc)

    def _advance(self, proc: ProcessStatus, now: float) -> None:
        if proc.state is ProcessState.STARTING:
            self._advance_starting(proc, now)
        elif proc.state is ProcessState.READY:
            self._advance_ready(proc, now)
        elif proc.state is ProcessState.BACKOFF and now >= (proc.restart_at or 0):
            self._spawn(proc)

    def _advance_starting(self, proc: ProcessStatus, now: float) -> None:
        assert proc.pid is not None and proc.started_at is not None  # set by _spawn
        code = self._reap(proc)
        if code is not None:  # a dead process fails fast, not after the readiness timeout
            self._on_exit(proc, code, now, " before it was ready")
        elif proc.spec.ready is None or proc.spec.ready(proc.pid):
            proc.state = ProcessState.READY
            proc.last_alive = now
            self._events.emit("process_ready", process=proc.name, pid=proc.pid, after_s=round(now - proc.started_at, 2))
        elif now - proc.started_at > proc.spec.ready_timeout_s:
            info = ExitInfo(ExitKind.STALLED, None, f"was not ready within {proc.spec.ready_timeout_s:.0f} s")
            self._kill_stuck(proc, info, now)

    def _advance_ready(self, proc: ProcessStatus, now: float) -> None:
        assert proc.pid is not None  # set by _spawn
        code = self._reap(proc)
        if code is not None:
            self._on_exit(proc, code, now)
            return
        if proc.spec.alive is None:
            return
        if proc.spec.alive(proc.pid):
            proc.last_alive = now
            return
        quiet = now - (proc.last_alive if proc.last_alive is not None else now)
        if quiet > proc.spec.stall_timeout_s:
            self._events.emit("process_stalled", process=proc.name, pid=proc.pid, quiet_s=round(quiet, 1))
            info = classify_exit(None, finishes=proc.spec.finishes, stalled=True, stalled_for_s=round(quiet))
            self._kill_stuck(proc, info, now)

    def _kill_stuck(self, proc: ProcessStatus, info: ExitInfo, now: float) -> None:
        self._dump(proc, info.description)
        self.kill_attempt(proc)
        self._fail(proc, info, now, info.description)

    def _on_exit(self, proc: ProcessStatus, code: int, now: float, when: str = "") -> None:
        info = classify_exit(code, finishes=proc.spec.finishes)
        if info.kind is ExitKind.DONE:
            proc.state = ProcessState.EXITED
            self._events.emit("process_exited", process=proc.name, pid=proc.pid, exit=info.description)
        else:
            self._fail(proc, info, now, info.description + when)

    def _fail(self, proc: ProcessStatus, info: ExitInfo, now: float, what: str) -> None:
        proc.state = ProcessState.FAILED
        proc.last_failure = what
        self._sweep(proc)
        decision = proc.tracker.on_failure(now, info)
        self._events.emit(
            "process_failed",
            process=proc.name,
            pid=proc.pid,
            reason=what,
            action=decision.action,
            delay_s=decision.delay_s,
            restarts_used=decision.restarts_used,
            budget=decision.budget,
        )
        if decision.action == "give_up":
            budget_spent = info.kind is not ExitKind.CONFIG_ERROR and proc.spec.restart.restart
            error = RestartsExhausted if budget_spent else ProcessFailed
            why = f"process '{proc.name}' {decision.reason}. Its log: {proc.log_path}"
            raise error(why, process=proc.name, log_tail=log_tail(proc.log_path))
        proc.state = ProcessState.BACKOFF
        proc.restart_at = now + decision.delay_s

    def _spawn(self, proc: ProcessStatus) -> None:
        if proc.handle is not None:  # a restart: a new attempt, a new log file
            proc.attempt += 1
        spec = proc.spec
        if spec.before_start is not None:
            spec.before_start()
        proc.handle = self._spawner.spawn(spec if proc.attempt == 0 else replace(spec, log_path=proc.log_path))
        proc.pid = proc.handle.pid
        proc.started_at = self._clock()
        proc.exit_code = None
        proc.restart_at = None
        proc.known_descendants = set()
        proc.state = ProcessState.STARTING
        proc.tracker.on_started(proc.started_at)
        kind = "process_started" if proc.attempt == 0 else "process_restarted"
        self._events.emit(kind, process=proc.name, pid=proc.pid, attempt=proc.attempt, log=str(proc.log_path))

    def _reap(self, proc: ProcessStatus) -> Optional[int]:
        assert proc.handle is not None  # set by _spawn
        proc.known_descendants.update(proc.handle.descendants())
        code = proc.handle.poll()
        if code is not None:
            proc.exit_code = code
        return code

    def kill_attempt(self, proc: ProcessStatus) -> None:
        """SIGKILL the current attempt's whole group (a stalled or hung process; a test's crash)."""
        assert proc.handle is not None  # set by _spawn
        proc.known_descendants.update(proc.handle.descendants(fresh=True))
        proc.handle.signal_group(signal.SIGKILL)
        proc.exit_code = self._wait_killed(proc)

    def _wait_killed(self, proc: ProcessStatus) -> Optional[int]:
        """The exit code of a SIGKILLed attempt, waited for at most KILL_WAIT_S; None (and an
        `process_unkillable` event) when it would not die."""
        assert proc.handle is not None  # set by _spawn
        deadline = self._clock() + KILL_WAIT_S
        while (code := proc.handle.poll()) is None and self._clock() < deadline:
            self._sleep(0.05)
        if code is None:
            log.error(
                "process '%s' (pid %s) is still there %g s after SIGKILL; left behind", proc.name, proc.pid, KILL_WAIT_S
            )
            self._events.emit("process_unkillable", process=proc.name, pid=proc.pid, waited_s=KILL_WAIT_S)
        return code

    def _dump(self, proc: ProcessStatus, reason: str) -> None:
        if self._diagnose is None or proc.handle is None:
            return
        started = self._clock()
        pids = [*proc.handle.descendants(fresh=True), proc.handle.pid]  # the process itself first, its guard last
        path = self._diagnose(proc.name, proc.attempt, pids, proc.log_path, reason)
        proc.last_dump = path
        self._events.emit(
            "stack_dump",
            process=proc.name,
            pid=proc.pid,
            attempt=proc.attempt,
            reason=reason,
            file=str(path) if path else None,
            took_s=round(self._clock() - started, 2),
        )

    def _sweep(self, proc: ProcessStatus) -> None:
        assert proc.handle is not None  # set by _spawn
        proc.handle.signal_group(signal.SIGKILL)
        swept = kill_pids(sorted(proc.known_descendants))
        if swept:
            self._events.emit("descendants_swept", process=proc.name, pids=swept)

    def _stop(self, proc: ProcessStatus) -> None:
        if proc.handle is None:
            return
        if proc.state in (ProcessState.STARTING, ProcessState.READY):
            proc.known_descendants.update(proc.handle.descendants(fresh=True))
            proc.state = ProcessState.STOPPING
            self._events.emit("process_stopping", process=proc.name, pid=proc.pid, signal="SIGTERM")
            proc.handle.signal_group(signal.SIGTERM)
            deadline = self._clock() + proc.spec.stop_grace_s
            while proc.handle.poll() is None and self._clock() < deadline:
                self._sleep(0.05)
            if proc.handle.poll() is None:
                self._dump(proc, f"still running {proc.spec.stop_grace_s:g} s after SIGTERM")
                self._events.emit(
                    "process_killed", process=proc.name, signal="SIGKILL", after_grace_s=proc.spec.stop_grace_s
                )
                proc.handle.signal_group(signal.SIGKILL)
                self._wait_killed(proc)
            proc.exit_code = proc.handle.poll()
            proc.state = ProcessState.STOPPED
        elif proc.state is ProcessState.BACKOFF:
            proc.state = ProcessState.STOPPED
        # Descendants that left the group (or outlived a crashed parent) are swept even when the
        # process itself had already exited.
        self._sweep(proc)


@contextmanager
def supervised(*specs: ProcessSpec, poll_interval_s: float = 0.05) -> Iterator[Supervisor]:
    """Start `specs` in order as a run does (guard, log, readiness), yield the supervisor, stop
    them in reverse order on the way out: one server alone, for tests and benchmarks."""
    supervisor = Supervisor(list(specs), EventLog(None), poll_interval_s=poll_interval_s)
    try:
        supervisor.start_all()
        yield supervisor
    finally:
        supervisor.stop_all()


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - 16_384))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
