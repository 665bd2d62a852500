"""The supervisor's logic with a fake operating system: start order, readiness gating, failure
handling, completion and stop order are asserted on the recorded events."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from rlrun.errors import ProcessFailed, RestartsExhausted
from rlrun.supervisor import EventLog, ProcessSpec, ProcessState, RunVerdict, Supervisor
from rlrun.supervisor.policy import RestartPolicy


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
        self.unkillable = False  # e.g. stuck in the kernel: not even SIGKILL ends it

    def poll(self):
        return self.exit_code

    def signal_group(self, sig: int) -> None:
        self.log.append(("signal", self.pid, signal.Signals(sig).name))
        if self.exit_code is None and not self.unkillable and (sig == signal.SIGKILL or not self.ignores_sigterm):
            self.exit_code = -sig

    def descendants(self, fresh: bool = False) -> list[int]:
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
        spec("redis", tmp_path, ready=lambda pid: clock.now >= ready_after["redis"]),
        spec("vllm", tmp_path, ready=lambda pid: clock.now >= ready_after["vllm"]),
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


def test_a_process_with_after_starts_once_those_are_ready_not_the_ones_before_it(tmp_path):
    clock = FakeClock()
    specs = [
        spec("redis", tmp_path, ready=lambda pid: clock.now >= 1.0),
        spec("vllm", tmp_path, ready=lambda pid: clock.now >= 30.0),
        spec("trainer", tmp_path, after=("redis",), ready=lambda pid: clock.now >= 5.0),
        spec("actor", tmp_path),  # default: after every process before it
    ]
    sup, spawner, events, _ = make(specs, clock)
    spawn_times = {}
    original = spawner.spawn
    spawner.spawn = lambda s: (spawn_times.__setitem__(s.name, clock.now), original(s))[1]
    sup.start_all()
    assert 1.0 <= spawn_times["trainer"] < 2.0  # beside vLLM's start, not after it
    assert spawn_times["vllm"] == spawn_times["trainer"]
    assert spawn_times["actor"] >= 30.0  # waited for vLLM and the trainer
    assert all(p.state is ProcessState.READY for p in sup.processes)


def test_after_naming_an_unknown_process_is_refused(tmp_path):
    with pytest.raises(ValueError, match="redis"):
        make([spec("trainer", tmp_path, after=("redis",))])


def test_a_process_that_dies_before_ready_fails_fast_not_after_timeout(tmp_path):
    (tmp_path / "vllm.log").write_text("line 1\nImportError: no vllm\n")
    specs = [spec("vllm", tmp_path, ready=lambda pid: False, ready_timeout_s=300)]
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
    sup, _, _, clock = make([spec("vllm", tmp_path, ready=lambda pid: False, ready_timeout_s=10)])
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
        return RunVerdict(exits["trainer"] == 0, "trainer done")

    assert sup.watch(finished) == "trainer done"
    assert sup.processes[1].state is ProcessState.EXITED  # exit 0 of a finishing role is expected
    assert checks[0] == {"redis": None, "trainer": None}
    assert events.recorded[-1]["event"] == "run_finished"


def test_a_service_exiting_even_with_0_is_a_failure(tmp_path):
    sup, spawner, events, _ = make([spec("redis", tmp_path), spec("trainer", tmp_path, finishes=True)])
    sup.start_all()
    spawner.handles["redis"].exit_code = 0
    with pytest.raises(ProcessFailed, match="'redis' exited with code 0 although it is a service"):
        sup.watch(lambda exits: RunVerdict(False, "not yet"))


def test_sigkill_death_mentions_the_oom_killer(tmp_path):
    sup, spawner, _, _ = make([spec("trainer", tmp_path, finishes=True)])
    sup.start_all()
    spawner.handles["trainer"].exit_code = -signal.SIGKILL
    with pytest.raises(ProcessFailed, match="killed by SIGKILL .possibly the OOM killer"):
        sup.watch(lambda exits: RunVerdict(False, "not yet"))


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


def test_a_stop_first_process_is_stopped_while_the_others_still_run(tmp_path):
    """A Fast-LLM trainer finishes its step on SIGTERM: it needs the actor's documents until it exits."""
    specs = [spec("redis", tmp_path), spec("trainer", tmp_path, stop_first=True, stop_grace_s=30), spec("actor", tmp_path)]
    sup, spawner, events, clock = make(specs)
    sup.start_all()
    trainer = spawner.handles["trainer"]
    trainer.ignores_sigterm = True
    running_while_trainer_stops = []

    def sleep(seconds):  # the trainer takes 3 s to finish its step; who is still running meanwhile?
        clock.now += seconds
        running_while_trainer_stops.append({n for n, h in spawner.handles.items() if h.poll() is None})
        if clock.now >= 3 and trainer.exit_code is None:
            trainer.exit_code = 0

    sup._sleep = sleep
    sup.stop_all()
    sigterms = [e[1] for e in spawner.log if e[0] == "signal" and e[2] == "SIGTERM"]
    pid = {name: h.pid for name, h in spawner.handles.items()}
    assert sigterms == [pid["trainer"], pid["actor"], pid["redis"]]
    assert {"actor", "redis"} <= running_while_trainer_stops[0]
    assert names_of(events, "process_killed") == []  # it exited within its grace period


def test_stop_before_start_touches_nothing(tmp_path):
    sup, spawner, events, _ = make([spec("redis", tmp_path)])
    sup.stop_all()
    assert spawner.log == [] and events.recorded == []


def test_duplicate_names_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        make([spec("a", tmp_path), spec("a", tmp_path)])


RESTARTING = RestartPolicy(restart=True, max_restarts=2, window_s=100, backoff_initial_s=1, backoff_factor=2, backoff_max_s=10, healthy_after_s=50)


def crash(spawner, name, code=1):
    spawner.handles[name].exit_code = code


def run_until(sup, clock, condition, limit_s=60):
    """Drive watch() until `condition()` holds (the completion predicate is our hook)."""
    return sup.watch(lambda exits: RunVerdict(condition() or clock.now > limit_s, "stop"))


def test_a_crashed_process_is_restarted_alone_after_its_backoff_with_a_new_log(tmp_path):
    specs = [spec("redis", tmp_path), spec("actor", tmp_path, restart=RESTARTING)]
    sup, spawner, events, clock = make(specs)
    sup.start_all()
    first_actor, redis_handle = spawner.handles["actor"], spawner.handles["redis"]
    crash(spawner, "actor")
    crashed_at = clock.now
    run_until(sup, clock, lambda: sup.status("actor").state is ProcessState.READY and sup.status("actor").attempt == 1)
    actor = sup.status("actor")
    assert spawner.handles["actor"] is not first_actor and spawner.handles["redis"] is redis_handle
    restarted = [e for e in events.recorded if e["event"] == "process_restarted"]
    assert len(restarted) == 1 and restarted[0]["process"] == "actor"
    assert restarted[0]["time"] - crashed_at >= 1.0  # waited out the 1 s backoff
    assert actor.log_path == tmp_path / "actor.1.log"
    failed = [e for e in events.recorded if e["event"] == "process_failed"][0]
    assert failed["action"] == "restart" and failed["restarts_used"] == 1 and failed["budget"] == 2


def test_a_process_crashing_at_every_start_spends_its_budget_and_stops_the_run(tmp_path):
    sup, spawner, events, clock = make([spec("redis", tmp_path), spec("actor", tmp_path, restart=RESTARTING)])
    sup.start_all()
    original = spawner.spawn

    def spawn_crashing(s):
        handle = original(s)
        if s.name == "actor":
            handle.exit_code = 1
        return handle

    spawner.spawn = spawn_crashing
    crash(spawner, "actor")
    with pytest.raises(RestartsExhausted, match="'actor' exited with code 1.*2 restarts within 100 s used up") as info:
        run_until(sup, clock, lambda: False)
    assert info.value.exit_code == 6
    delays = [e["delay_s"] for e in events.recorded if e["event"] == "process_failed" and e["action"] == "restart"]
    assert delays == [1, 2]  # exponential backoff
    sup.stop_all()
    assert sup.status("redis").state is ProcessState.STOPPED


def test_a_config_error_exit_is_never_retried(tmp_path):
    sup, spawner, events, clock = make([spec("trainer", tmp_path, finishes=True, restart=RESTARTING)])
    sup.start_all()
    crash(spawner, "trainer", code=2)
    with pytest.raises(ProcessFailed, match="not retried") as info:
        run_until(sup, clock, lambda: False)
    assert not isinstance(info.value, RestartsExhausted)
    assert [e["event"] for e in events.recorded].count("process_restarted") == 0


def test_a_process_without_signs_of_life_is_killed_as_stalled_and_restarted(tmp_path):
    alive = {"value": True}
    specs = [spec("vllm", tmp_path, restart=RESTARTING, alive=lambda pid: alive["value"], stall_timeout_s=10)]
    sup, spawner, events, clock = make(specs)
    sup.start_all()
    stalled_handle = spawner.handles["vllm"]
    alive["value"] = False  # e.g. SIGSTOPped: /health no longer answers
    went_quiet = clock.now
    run_until(sup, clock, lambda: sup.status("vllm").attempt == 1)
    stall = next(e for e in events.recorded if e["event"] == "process_stalled")
    assert 10 <= stall["time"] - went_quiet <= 11  # detected within its timeout (+ one poll)
    assert ("signal", stalled_handle.pid, "SIGKILL") in spawner.log
    failed = next(e for e in events.recorded if e["event"] == "process_failed")
    assert "stalled: no progress" in failed["reason"] and failed["action"] == "restart"


def test_a_process_failing_at_its_first_start_follows_its_restart_policy(tmp_path):
    sup, spawner, events, clock = make([spec("vllm", tmp_path, restart=RESTARTING, ready=lambda pid: False, ready_timeout_s=5)])
    with pytest.raises(RestartsExhausted, match="was not ready within 5 s.*2 restarts within 100 s used up"):
        sup.start_all()
    assert [e["event"] for e in events.recorded].count("process_restarted") == 2


def test_a_process_that_survives_sigkill_is_reported_and_the_stop_goes_on(tmp_path):
    from rlrun.supervisor.supervisor import KILL_WAIT_S

    sup, spawner, events, clock = make([spec("redis", tmp_path), spec("vllm", tmp_path, stop_grace_s=5)])
    sup.start_all()
    spawner.handles["vllm"].unkillable = True
    started = clock.now
    sup.stop_all()  # returns: the wait after SIGKILL has a deadline
    assert KILL_WAIT_S <= clock.now - started - 5 < KILL_WAIT_S + 1
    (stuck,) = [e for e in events.recorded if e["event"] == "process_unkillable"]
    assert (stuck["process"], stuck["pid"]) == ("vllm", spawner.handles["vllm"].pid)
    assert spawner.handles["redis"].poll() == -signal.SIGTERM  # stopped after it, as usual


def test_an_exit_rejected_by_the_completion_rule_is_restarted_and_before_start_runs_each_time(tmp_path):
    calls = []
    trainer = spec("trainer", tmp_path, finishes=True, restart=RESTARTING, before_start=lambda: calls.append("tidy"))
    sup, spawner, events, clock = make([trainer])
    sup.start_all()
    spawner.handles["trainer"].exit_code = 0  # e.g. Fast-LLM's training_finished after a SIGTERM at step 3

    def rule(exits):
        if exits["trainer"] == 0 and sup.status("trainer").attempt == 0:
            return RunVerdict(False, "interrupted at step 3 of 10", reject="trainer")
        return RunVerdict(sup.status("trainer").attempt == 1, "restarted")

    sup.watch(rule)
    failed = next(e for e in events.recorded if e["event"] == "process_failed")
    assert "before its work was done (interrupted at step 3 of 10)" in failed["reason"] and failed["action"] == "restart"
    assert calls == ["tidy", "tidy"]  # before the first start and before the restart


def test_a_stalled_process_is_diagnosed_before_the_kill_and_the_event_names_the_file(tmp_path):
    alive = {"value": True}
    clock = FakeClock()
    spawner = FakeSpawner()
    events = EventLog(None, clock=clock)
    calls = []

    def diagnose(process, attempt, pids, log_path, reason):
        killed = [entry for entry in spawner.log if entry[0] == "signal"]
        calls.append((process, attempt, pids, log_path.name, reason, killed))
        clock.now += 4.0  # py-spy takes its time: the event says how long, on the supervisor's clock
        return tmp_path / f"{process}-{attempt}.txt"

    specs = [spec("actor", tmp_path, restart=RESTARTING, alive=lambda pid: alive["value"], stall_timeout_s=10, stop_grace_s=1)]
    sup = Supervisor(specs, events, spawner=spawner, clock=clock, sleep=clock.sleep, diagnose=diagnose)
    sup.start_all()
    stalled_pid = spawner.handles["actor"].pid
    alive["value"] = False
    run_until(sup, clock, lambda: sup.status("actor").attempt == 1)
    assert calls == [("actor", 0, [stalled_pid], "actor.log", "stalled: no progress for 10 s, killed by the watchdog", [])]  # not yet killed
    dump = next(e for e in events.recorded if e["event"] == "stack_dump")
    assert dump["file"] == str(tmp_path / "actor-0.txt") and dump["attempt"] == 0 and dump["took_s"] == 4.0
    assert sup.status("actor").last_dump == tmp_path / "actor-0.txt"

    # A stop whose SIGTERM is ignored is diagnosed before the SIGKILL; one that obeys is not.
    spawner.handles["actor"].ignores_sigterm = True
    sup.stop_all()
    assert calls[-1][0:2] == ("actor", 1) and "after SIGTERM" in calls[-1][4]
    assert calls[-1][5][-1] == ("signal", spawner.handles["actor"].pid, "SIGTERM")
    assert len(calls) == 2


# --- the progress watchdog: every process alive, no progress ------------------------------------


def watched(tmp_path, progress: dict, alive: dict | None = None, restart=RESTARTING, diagnose=None):
    """redis, a trainer and an actor that all heartbeat; the run's progress is `progress["step"]`."""
    from rlrun.supervisor import ProgressWatch

    alive = alive if alive is not None else {}
    reports = []
    specs = [spec("redis", tmp_path)] + [
        spec(name, tmp_path, restart=restart, alive=lambda pid, name=name: alive.get(name, True), stall_timeout_s=10)
        for name in ("trainer", "actor")
    ]
    clock, spawner = FakeClock(), FakeSpawner()
    events = EventLog(None, clock=clock)
    sup = Supervisor(specs, events, spawner=spawner, clock=clock, sleep=clock.sleep, poll_interval_s=0.5, diagnose=diagnose)
    watch = ProgressWatch(marker=lambda: progress["step"], timeout_s=30, suspects=("trainer", "actor"),
                          report=lambda why: reports.append((clock.now, why)) or tmp_path / "run-stalled.txt")  # fmt: skip
    return sup, spawner, events, clock, watch, reports


def test_no_progress_while_every_process_is_alive_is_a_stall_of_the_run(tmp_path):
    """An injected deadlock: both processes heartbeat, the step stays. The run's state is
    reported, each suspect dumped and restarted like a stalled process, the clock starts again."""
    dumps = []
    progress = {"step": 7}
    sup, spawner, events, clock, watch, reports = watched(
        tmp_path, progress, diagnose=lambda process, attempt, pids, log_path, reason: dumps.append((process, reason)) or tmp_path / f"{process}.txt"
    )  # fmt: skip
    sup.start_all()
    stuck = {name: spawner.handles[name].pid for name in ("trainer", "actor")}
    quiet_from = clock.now
    sup.watch(lambda exits: RunVerdict(sup.status("actor").attempt == 1 and sup.status("actor").state is ProcessState.READY, "x"), watch)
    (stalled,) = [e for e in events.recorded if e["event"] == "run_stalled"]
    assert 30 < stalled["time"] - quiet_from <= 31  # its timeout, within a poll
    assert stalled["restarting"] == ["trainer", "actor"] and stalled["progress"] == "7"
    assert stalled["report"] == str(tmp_path / "run-stalled.txt")
    assert len(reports) == 1 and "no progress for 30 s while every process was alive (progress_timeout_s=30)" in reports[0][1]
    assert [d[0] for d in dumps] == ["trainer", "actor"] and all("stalled: the run made no progress" in d[1] for d in dumps)
    for name, pid in stuck.items():
        assert ("signal", pid, "SIGKILL") in spawner.log
    failed = [e for e in events.recorded if e["event"] == "process_failed"]
    assert [(e["process"], e["action"]) for e in failed] == [("trainer", "restart"), ("actor", "restart")]
    assert names_of(events, "stack_dump") == ["trainer", "actor"]
    assert spawner.handles["redis"].poll() is None  # not a suspect: left alone


def test_progress_resets_the_clock_and_a_process_not_alive_is_left_to_its_own_watchdog(tmp_path):
    progress, alive = {"step": 0}, {}
    sup, spawner, events, clock, watch, reports = watched(tmp_path, progress, alive)
    sup.start_all()

    def rule(exits):
        if clock.now < 100:
            progress["step"] = int(clock.now // 20)  # a step every 20 s: under the 30 s timeout
        elif clock.now < 125:
            alive["actor"] = sup.status("actor").attempt > 0  # frozen (SIGSTOP) until restarted: the process watchdog's case
        return RunVerdict(clock.now > 135, "done")  # before 30 s quiet after the restart

    sup.watch(rule, watch)
    assert [e for e in events.recorded if e["event"] == "run_stalled"] == [] and reports == []
    assert names_of(events, "process_stalled") == ["actor"]  # caught by its own watchdog


def test_a_run_that_stalls_again_after_every_restart_stops_when_the_budget_is_spent(tmp_path):
    progress = {"step": 3}
    once = RestartPolicy(restart=True, max_restarts=1, window_s=1000, backoff_initial_s=1, backoff_max_s=1)
    sup, spawner, events, clock, watch, reports = watched(tmp_path, progress, restart=once)
    sup.start_all()
    with pytest.raises(RestartsExhausted, match="'trainer' stalled: the run made no progress for 3[01] s.*1 restarts within 1000 s used up") as info:
        sup.watch(lambda exits: RunVerdict(False, ""), watch)
    assert info.value.exit_code == 6
    assert [e["event"] for e in events.recorded].count("run_stalled") == 2 and len(reports) == 2


def test_the_progress_clock_counts_only_while_every_process_is_alive():
    from rlrun.supervisor.stall import ProgressClock

    clock = ProgressClock(timeout_s=10, now=0)
    assert clock.observe(1, True, 0) is None and clock.observe(1, True, 5) is None
    assert clock.observe(1, True, 10) is None and clock.observe(1, True, 10.5) == 10.5
    assert clock.observe(2, True, 11) is None  # progress
    assert clock.observe(2, False, 30) is None and clock.observe(2, True, 35) is None  # a restart started it again
    assert clock.observe(None, True, 50) is None  # cannot tell: no verdict, and no credit either
    assert clock.observe(2, True, 60.5) == 10.5
