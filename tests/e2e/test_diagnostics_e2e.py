"""A frozen actor in a live run: the watchdog fires, a stack dump names the function the actor was
in, the run recovers and completes; `rlrun status --json` and `rlrun runs` read the run while it
is live and after it finished, and the time the freeze cost is in the ETTR split. Later in the same
run, a deadlock is injected (the actor held by back-pressure: the trainer's count of the entries
it trained is set back to 0, again and again, while the trainer waits for groups): every process
stays alive, the progress watchdog declares the run stalled, its report and the dumps name where
each process waits, the trainer and actor are restarted and the run completes.

One real-stack run (Redis, vLLM CPU, trainer, actor) serves every test here."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

import rlrun.actor.loop as actor_loop
import rlrun.entrypoints.actor as actor_entrypoint

from .conftest import current_pid, events, left_behind, read_jsonl, run_cli, start_rlrun, steps_done, wait_for

pytestmark = pytest.mark.e2e

STEPS = 30
STALL_S = 10
PROGRESS_S = 25  # supervisor.progress_timeout_s: steps take ~1 s here, a restarted actor's first batch a few


def run_redis(run_dir):
    """A client of the live run's Redis (its URL from a role file, its password from secrets/)."""
    import yaml

    from rlrun.streams.server import connect

    url = yaml.safe_load((run_dir / "roles" / "trainer.yaml").read_text())["redis_url"]
    return connect(url, (run_dir / "secrets" / "redis.password").read_text().strip())


def hold_the_actor_until_the_run_stalls(run_dir, proc) -> None:
    """Set the trainer's trained-entries count back to 0 every 0.1 s (it rewrites it at every step):
    the actor sees its whole stream as untrained and opens nothing, the trainer drains what is left
    and waits for groups. Stops once the supervisor says the run stalled."""
    from rlrun.streams import names

    client, started = run_redis(run_dir), time.time()
    while not any(e["event"] == "run_stalled" for e in events(run_dir)):
        assert proc.poll() is None and time.time() - started < 180, "no run_stalled event"
        client.hset(names.TRAINER_STATE, names.trained_entries(names.GROUPS_STREAM), 0)
        time.sleep(0.1)
    client.close()


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("frozen") / "run"
    proc = start_rlrun(
        run_dir, "recipe=math_grpo", f"trainer.max_train_steps={STEPS}", "trainer.checkpoint_every=8",
        f"supervisor.actor.stall_timeout_s={STALL_S}", "supervisor.stop_grace_s=5", f"supervisor.progress_timeout_s={PROGRESS_S}",
    )  # fmt: skip
    seen = {}
    try:
        wait_for(lambda: steps_done(run_dir) >= 2, 600, "step 2", proc)
        os.kill(current_pid(run_dir, "actor"), signal.SIGSTOP)  # at once: steps take ~1 s here
        seen["frozen_at"] = time.time()
        seen["live_status"] = run_cli(["status", str(run_dir), "--json"], timeout=120)  # live, while frozen
        seen["live_runs"] = run_cli(["runs", str(run_dir.parent), "--json"], timeout=120)
        wait_for(lambda: any(e["event"] == "process_restarted" and e["process"] == "actor" for e in events(run_dir)), 120, "the actor restart", proc)
        mark = steps_done(run_dir)
        wait_for(lambda: steps_done(run_dir) >= mark + 2, 300, "progress after the actor restart", proc)
        seen["held_at_step"] = steps_done(run_dir)
        assert seen["held_at_step"] < STEPS - 4, "too late in the run to inject the deadlock"
        hold_the_actor_until_the_run_stalls(run_dir, proc)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    seen["left"] = left_behind(proc)
    seen["final_status"] = run_cli(["status", str(run_dir), "--json"], timeout=120)
    seen["final_runs"] = run_cli(["runs", str(run_dir.parent), "--json"], timeout=120)
    seen["output"] = (run_dir.parent / "rlrun.out").read_text()
    return proc.returncode, run_dir, seen


def test_the_frozen_actor_is_dumped_then_restarted_and_the_run_completes(frozen_run):
    code, run_dir, seen = frozen_run
    assert code == 0, seen["output"][-4000:]
    assert steps_done(run_dir) == STEPS
    evs = events(run_dir)
    kinds = [(e["event"], e.get("process")) for e in evs]
    stalled = kinds.index(("process_stalled", "actor"))
    dumped = kinds.index(("stack_dump", "actor"))
    failed = kinds.index(("process_failed", "actor"))
    assert stalled < dumped < failed < kinds.index(("process_restarted", "actor"))
    assert evs[dumped]["took_s"] <= 5 + 1  # bounded by supervisor.dump_timeout_s
    assert evs[stalled]["time"] - seen["frozen_at"] < STALL_S + 5 + 2  # + heartbeat freshness + a poll
    assert seen["left"] == []


def defined_in(module, dotted: str) -> bool:
    """`Actor.run` names something `module` defines."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj is not None


def test_the_dump_holds_the_actors_python_stack_naming_its_function(frozen_run):
    _, run_dir, _ = frozen_run
    dump = next(e for e in events(run_dir) if e["event"] == "stack_dump" and e["process"] == "actor")
    path = run_dir / "diagnostics" / os.path.basename(dump["file"])
    assert path.is_file() and path.name.startswith("actor-0-")
    text = path.read_text()
    # Caught computing, the actor is in its loop (`Actor.run`, or a method of it); caught waiting,
    # the running coroutines are off the thread's stack and the frame is the entry point's `main`.
    frames = re.findall(r"^\s+([\w.]+) \((rlrun/actor/loop|rlrun/entrypoints/actor)\.py:\d+\)", text, re.MULTILINE)
    assert frames, text[:3000]
    modules = {"rlrun/actor/loop": actor_loop, "rlrun/entrypoints/actor": actor_entrypoint}
    assert all(defined_in(modules[path], name) or hasattr(actor_loop.Actor, name) for name, path in frames), frames
    assert "[stopped]" in text or "[tracing-stop]" in text  # psutil saw it frozen
    assert "rss" in text and "## last 40 lines" in text


def test_status_json_and_runs_while_live_and_after_the_end(frozen_run):
    _, run_dir, seen = frozen_run
    live = json.loads(seen["live_status"].stdout)
    assert live["live"] is True and live["status"] == "running" and live["progress"]["step"] >= 2
    assert {p["name"] for p in live["processes"]} >= {"redis", "vllm-0", "trainer", "actor"}
    assert live["ettr"]["wall_s"] > 0
    (listed,) = json.loads(seen["live_runs"].stdout)
    assert listed["status"] == "running" and listed["step"] >= 2
    final = json.loads(seen["final_status"].stdout)
    assert final["live"] is False and final["status"] == "finished" and final["progress"]["step"] == STEPS
    assert final["last_failure"]["process"] == "actor" and "stalled" in final["last_failure"]["reason"]
    actor = next(p for p in final["processes"] if p["name"] == "actor")
    assert actor["restarts"] >= 1 and actor["last_dump"].endswith(".txt")
    (listed,) = json.loads(seen["final_runs"].stdout)
    assert listed["status"] == "finished" and listed["step"] == STEPS and listed["ettr"] == final["ettr"]["ettr"]


def test_the_freeze_shows_in_the_ettr_split_metrics_and_final_summary(frozen_run):
    _, run_dir, seen = frozen_run
    split = json.loads(seen["final_status"].stdout)["ettr"]
    failure = next(f for f in split["failures"] if f["process"] == "actor")  # the freeze (the deadlock's restart follows)
    assert failure["recovery_s"] is not None and failure["recovery_s"] > 0
    assert split["seconds"]["recovery"] >= failure["recovery_s"] - 0.01
    assert sum(split["seconds"].values()) == pytest.approx(split["wall_s"], abs=0.1)
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert all(0 <= r["ettr"] <= 1 for r in records) and all(r["wait_s"] <= r["step_time_s"] for r in records)
    assert "ETTR" in seen["output"] and "failure(s): actor recovered in" in seen["output"]
    print(f"\nfrozen-actor run: {json.dumps(split)}")


def test_the_injected_deadlock_is_a_stall_of_the_run_reported_then_restarted(frozen_run):
    code, run_dir, seen = frozen_run
    assert code == 0, seen["output"][-4000:]
    evs = events(run_dir)
    (stalled,) = [e for e in evs if e["event"] == "run_stalled"]
    assert stalled["restarting"] == ["trainer", "actor"]
    # Quiet while held, no sooner: counted from when the supervisor saw the last step, which is no
    # earlier than the record of the step the test saw before holding (a step is recorded, then
    # published to Redis); + 0.1 for the rounding of quiet_s and of the times.
    held = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["step"] == seen["held_at_step"] and r["time"] <= stalled["time"]]
    assert PROGRESS_S < stalled["quiet_s"] <= stalled["time"] - held[-1]["time"] + 0.1
    later = [e for e in evs if e["time"] >= stalled["time"]]
    for name in ("trainer", "actor"):
        failed = next(e for e in later if e["event"] == "process_failed" and e["process"] == name)
        assert "stalled: the run made no progress" in failed["reason"] and failed["action"] == "restart"
        assert any(e["event"] == "process_restarted" and e["process"] == name for e in later)
    assert steps_done(run_dir) == STEPS  # and it completed at its exact step


def test_the_report_and_the_dumps_name_where_each_process_waits(frozen_run):
    import yaml

    _, run_dir, seen = frozen_run
    evs = events(run_dir)
    stalled = next(e for e in evs if e["event"] == "run_stalled")
    text = (run_dir / "diagnostics" / os.path.basename(stalled["report"])).read_text()
    report = yaml.safe_load(text.split("\n\n", 1)[1])
    assert re.fullmatch(r"groups \(\d+ of 32 for step \d+\)", report["waits"]["trainer"]), report["waits"]
    assert report["waits"]["actor"].startswith("back-pressure for "), report["waits"]
    window = report["actor"]["backpressure"]
    assert window["room"] is False and window["trained_entries"] == 0 and window["waiting"] >= window["limit"]
    dump = next(e for e in evs if e["event"] == "stack_dump" and e["process"] == "trainer" and e["time"] >= stalled["time"])
    stacks = (run_dir / "diagnostics" / os.path.basename(dump["file"])).read_text()
    assert re.search(r"_read_batch \(rlrun/trainer/batches\.py:\d+\)", stacks), stacks[:3000]  # waiting for groups
    assert re.search(r"read \(rlrun/trainer/intake\.py:\d+\)", stacks), stacks[:3000]
    assert any(e["event"] == "stack_dump" and e["process"] == "actor" and e["time"] >= stalled["time"] for e in evs)
