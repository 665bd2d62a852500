"""`rlrun status` rebuilds each process's state from the recorded supervisor events."""

from rlrun.cli.status import replay_events


def ev(kind, process, **fields):
    return {"time": 0.0, "event": kind, "process": process, **fields}


def test_replay_follows_restarts_and_failures():
    rows = replay_events(
        [
            ev("process_started", "vllm-0", pid=10, log="logs/vllm-0.log"),
            ev("process_ready", "vllm-0", pid=10),
            ev("process_failed", "vllm-0", reason="killed by SIGKILL (possibly the OOM killer)", action="restart"),
            ev("process_restarted", "vllm-0", pid=11, log="logs/vllm-0.1.log"),
            ev("process_started", "trainer", pid=20, log="logs/trainer.log"),
        ]
    )
    vllm, trainer = rows
    assert (vllm.name, vllm.pid, vllm.state, vllm.restarts, vllm.log) == ("vllm-0", 11, "starting", 1, "logs/vllm-0.1.log")
    assert "SIGKILL" in vllm.last_failure
    assert (trainer.state, trainer.restarts) == ("starting", 0)


def test_a_failure_waiting_for_its_restart_shows_as_backoff_and_a_final_one_as_failed():
    rows = replay_events(
        [
            ev("process_started", "actor", pid=1),
            ev("process_failed", "actor", reason="exited with code 1", action="restart"),
            ev("process_started", "redis", pid=2),
            ev("process_failed", "redis", reason="exited with code 1: 3 restarts used up", action="give_up"),
        ]
    )
    assert [r.state for r in rows] == ["backoff", "failed"]


def test_after_run_stopped_running_processes_show_as_stopped_and_exited_ones_stay_exited():
    rows = replay_events(
        [
            ev("process_started", "trainer", pid=1),
            ev("process_exited", "trainer", pid=1),
            ev("process_started", "actor", pid=2),
            ev("process_ready", "actor", pid=2),
            {"time": 1.0, "event": "run_stopped", "status": "finished"},
        ]
    )
    assert [(r.name, r.state) for r in rows] == [("trainer", "exited"), ("actor", "stopped")]


def test_unrelated_or_unknown_events_are_ignored():
    assert replay_events([{"event": "run_finished"}, ev("something_new", "x")]) == []


def test_the_last_stack_dump_of_a_process_is_kept_and_shown_next_to_its_failure():
    from rich.console import Console

    from rlrun.cli.live import status_table

    rows = replay_events(
        [
            ev("process_started", "actor", pid=1),
            ev("process_stalled", "actor", pid=1, quiet_s=61.0),
            ev("stack_dump", "actor", pid=1, attempt=0, reason="stalled", file="/r/diagnostics/actor-0-20260101-000000.txt"),
            ev("process_failed", "actor", reason="stalled: no progress for 61 s", action="restart"),
        ]
    )
    assert rows[0].last_dump == "/r/diagnostics/actor-0-20260101-000000.txt"
    console = Console(width=300, record=True)
    console.print(status_table(rows))
    assert "actor-0-20260101-000000.txt" in console.export_text()
