"""The supervisor's logic with a fake operating system: start order, readiness gating, failure
handling, completion and stop order are asserted on the recorded events."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from rlrun.errors import ProcessFailed
from rlrun.supervisor import EventLog, ProcessSpec, ProcessState, Supervisor


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeHandle:
    def __init__(self, pid: int, log: list) -> None:
        self.pid = pid
        self.exit_code = None
        self.log = log
        self.ignores_sigterm = False

    def poll(self):
        return self.exit_code

    def signal_group(self, sig: int) -> None:
        self.log.append(("signal", self.pid, signal.Signals(sig).name))
        if self.exit_code is None and (sig == signal.SIGKILL or not self.ignores_sigterm):
            self.exit_code = -sig

    def descendants(self) -> list[int]:
        return []


class FakeSpawner:
    def __init__(self) -> None:
        self.log: list = []
        self.handles: dict[str, FakeHandle] = {}

    def spawn(self, spec: ProcessSpec) -> FakeHandle:
        handle = FakeHandle(100 + len(self.handles), self.log)
        self.handles[spec.name] = handle
        self.log.append(("spawn", spec.name))
        return handle


def make(specs, clock=None):
    clock = clock or FakeClock()
    spawner = FakeSpawner()
    events = EventLog(None, clock=clock)
    sup = Supervisor(specs, events, spawner=spawner, clock=clock, sleep=clock.sleep, poll_interval_s=0.5)
    return sup, spawner, events, clock


def spec(name, tmp_path: Path, **kw) -> ProcessSpec:
    return ProcessSpec(name=name, argv=["true"], log_path=tmp_path / f"{name}.log", **kw)


def names_of(events, kind):
    return [e["process"] for e in events.recorded if e["event"] == kind]


def test_starts_in_order_each_gated_on_readiness(tmp_path):
    ready_after = {"redis": 1.0, "vllm": 3.0}
    clock = FakeClock()
    specs = [
        spec("redis", tmp_path, ready=lambda: clock.now >= ready_after["redis"]),
        spec("vllm", tmp_path, ready=lambda: clock.now >= ready_after["vllm"]),
        spec("actor", tmp_path),
    ]
    sup, spawner, events, _ = make(specs, clock)
    spawn_times = {}
    original = spawner.spawn
    spawner.spawn = lambda s: (spawn_times.__setitem__(s.name, clock.now), original(s))[1]
    sup.start_all()
    assert [e for e in spawner.log if e[0] == "spawn"] == [("spawn", "redis"), ("spawn", "vllm"), ("spawn", "actor")]
    assert spawn_times["vllm"] >= 1.0  # not before redis was ready
    assert spawn_times["actor"] >= 3.0  # not before vllm was ready
    assert all(p.state is ProcessState.READY for p in sup.processes)


def test_a_process_that_dies_before_ready_fails_fast_not_after_timeout(tmp_path):
    (tmp_path / "vllm.log").write_text("line 1\nImportError: no vllm\n")
    specs = [spec("vllm", tmp_path, ready=lambda: False, ready_timeout_s=300)]
    sup, spawner, events, clock = make(specs)
    original = spawner.spawn

    def spawn_and_die(s):
        handle = original(s)
        handle.exit_code = 1
        return handle

    spawner.spawn = spawn_and_die
    with pytest.raises(ProcessFailed) as info:
        sup.start_all()
    assert clock.now < 1.0  # no waiting for the 300 s readiness timeout
    assert info.value.process == "vllm"
    assert "ImportError: no vllm" in info.value.log_tail
    assert "code 1" in str(info.value)


def test_readiness_timeout_is_a_failure(tmp_path):
    sup, _, _, clock = make([spec("vllm", tmp_path, ready=lambda: False, ready_timeout_s=10)])
    with pytest.raises(ProcessFailed, match="not ready within 10 s"):
        sup.start_all()
    assert 10 <= clock.now <= 11


def test_watch_returns_when_the_completion_rule_says_finished(tmp_path):
    sup, spawner, events, clock = make([spec("redis", tmp_path), spec("trainer", tmp_path, finishes=True)])
    sup.start_all()
    checks = []

    def finished(exits):
        checks.append(dict(exits))
        if clock.now >= 2.0:
            spawner.handles["trainer"].exit_code = 0
        return exits["trainer"] == 0, "trainer done"

    assert sup.watch(finished) == "trainer done"
    assert sup.processes[1].state is ProcessState.EXITED  # exit 0 of a finishing role is expected
    assert checks[0] == {"redis": None, "trainer": None}
    assert events.recorded[-1]["event"] == "run_finished"


def test_a_service_exiting_even_with_0_is_a_failure(tmp_path):
    sup, spawner, events, _ = make([spec("redis", tmp_path), spec("trainer", tmp_path, finishes=True)])
    sup.start_all()
    spawner.handles["redis"].exit_code = 0
    with pytest.raises(ProcessFailed, match="'redis' exited with code 0"):
        sup.watch(lambda exits: (False, "not yet"))


def test_sigkill_death_mentions_the_oom_killer(tmp_path):
    sup, spawner, _, _ = make([spec("trainer", tmp_path, finishes=True)])
    sup.start_all()
    spawner.handles["trainer"].exit_code = -signal.SIGKILL
    with pytest.raises(ProcessFailed, match="signal SIGKILL.*OOM killer"):
        sup.watch(lambda exits: (False, "not yet"))


def test_stop_is_reverse_order_sigterm_then_sigkill_after_grace(tmp_path):
    specs = [spec("redis", tmp_path, stop_grace_s=5), spec("vllm", tmp_path, stop_grace_s=5), spec("actor", tmp_path, stop_grace_s=5)]
    sup, spawner, events, clock = make(specs)
    sup.start_all()
    spawner.handles["vllm"].ignores_sigterm = True
    started = clock.now
    sup.stop_all()
    signals = [(e[1], e[2]) for e in spawner.log if e[0] == "signal"]
    pid = {name: h.pid for name, h in spawner.handles.items()}
    # actor first, then vllm (SIGTERM ignored → SIGKILL after the grace period), redis last
    assert signals[0] == (pid["actor"], "SIGTERM")
    assert (pid["vllm"], "SIGTERM") in signals and (pid["vllm"], "SIGKILL") in signals
    assert signals.index((pid["vllm"], "SIGTERM")) < signals.index((pid["redis"], "SIGTERM"))
    assert names_of(events, "process_killed") == ["vllm"]
    assert clock.now - started >= 5  # the grace period was waited for
    assert all(p.state is ProcessState.STOPPED for p in sup.processes)


def test_stop_before_start_touches_nothing(tmp_path):
    sup, spawner, events, _ = make([spec("redis", tmp_path)])
    sup.stop_all()
    assert spawner.log == [] and events.recorded == []


def test_duplicate_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        make([spec("a", tmp_path), spec("a", tmp_path)])
