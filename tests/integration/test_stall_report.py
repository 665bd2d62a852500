"""What a stalled run's report says, read from the run's real Redis: where the trainer waits, where
each actor waits and the back-pressure between them (the state of issue 26's deadlock: a trainer
set back to step 10 waiting for groups, an actor counting groups the trainer would never read);
a weight update in flight that is stuck; and the progress of a trainer that publishes no state of
its own (Fast-LLM), from its events."""

from __future__ import annotations

import re
import time

import yaml

from rlrun.config import compose
from rlrun.parts.progress import ProgressReader
from rlrun.run.built import build
from rlrun.streams import names
from rlrun.supervisor import EventLog
from rlrun.supervisor.diagnostics import write_report


def test_the_report_names_what_the_trainer_and_the_actor_wait_for(server, client):
    cfg, _ = compose(["recipe=math_grpo", "actor.max_steps_ahead=1"])
    per_step = cfg.groups_per_step
    for n in range(24 * per_step):
        client.xadd(names.GROUPS_STREAM, {"data": f"group-{n}"})
    client.xgroup_create(names.GROUPS_STREAM, names.TRAINER_GROUP, id="$")
    now = time.time()
    client.hset(names.TRAINER_STATE, mapping={"step": 17, "policy_version": 17, names.trained_entries(names.GROUPS_STREAM): 24 * per_step,
                                              "heartbeat": now, "waiting_for": f"groups (0 of {per_step} for step 18)"})  # fmt: skip
    client.set(names.POLICY_VERSION, 17)
    client.hset(names.ACTOR_STATE, mapping={"heartbeat": now, "in_flight": 0, "held_by_backpressure_since": now - 93, "groups_published": 432})
    progress = ProgressReader(server.url, server.run_dir, num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)

    path = write_report(server.run_dir.diagnostics, "run-stalled", "no progress for 93 s", progress.stall_state(build(cfg).backend.trainer_view))
    taken_s = time.time() - now  # the report says how long the actor has been held as of its own now

    text = path.read_text()
    assert path.parent == server.run_dir.diagnostics and "reason: no progress for 93 s" in text
    report = yaml.safe_load(text.split("\n\n", 1)[1])
    assert report["waits"]["trainer"] == f"groups (0 of {per_step} for step 18)"
    held = re.match(r"back-pressure for (\d+) s", report["waits"]["actor"])
    assert held and 93 <= int(held.group(1)) <= round(93 + taken_s), report["waits"]["actor"]
    window = report["actor"]["backpressure"]
    assert (window["trainer_step"], window["trained_entries"], window["entries"]) == (17, 24 * per_step, 24 * per_step)
    assert window["room"] is True  # what the trainer read is all trained: this actor may go on
    stream = report["streams"][names.GROUPS_STREAM]
    assert stream["entries"] == 24 * per_step and stream[f"group {names.TRAINER_GROUP}"]["lag"] == 0
    assert report["trainer"]["step"] == "17" and report["policy_version_served"] == "17"


def test_the_report_names_a_weight_update_that_is_stuck(server, client):
    """What the hf trainer's rank 0 publishes while it hands a version to vLLM (StatePublisher.updating),
    read back by the stalled run's report: which version, for how long."""
    from rlrun.trainer.published_state import StatePublisher
    from rlrun.trainer.stopping import Stopping

    cfg, _ = compose(["recipe=math_grpo"])
    published = StatePublisher(Stopping(client), rank=0, max_train_steps=20)
    published.updating(18)
    published.heartbeat()
    client.hset(names.TRAINER_STATE, names.UPDATING_WEIGHTS_SINCE, time.time() - 300)  # as if it began 5 minutes ago
    progress = ProgressReader(server.url, server.run_dir, num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)

    path = write_report(server.run_dir.diagnostics, "run-stalled", "no progress for 300 s", progress.stall_state(build(cfg).backend.trainer_view))

    report = yaml.safe_load(path.read_text().split("\n\n", 1)[1])
    assert re.match(r"its weight update to policy version 18, in progress for 30\d s \(since ", report["waits"]["trainer"]), report["waits"]
    assert report["trainer"][names.UPDATING_WEIGHTS_TO] == "18"
    published.updating(None)  # the update ended: the report no longer names it
    assert progress.stall_state(build(cfg).backend.trainer_view)["waits"]["trainer"].startswith("nothing it says")


def test_the_report_says_so_when_redis_cannot_be_read(tmp_path):
    from rlrun.rundir import RunDir

    cfg, _ = compose([])
    run = RunDir(tmp_path / "run")
    run.create({"name": "t"})
    state = ProgressReader("redis://127.0.0.1:1/0", run, num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps).stall_state(build(cfg).backend.trainer_view)
    assert state["error"].startswith("cannot read the run's Redis")


def test_a_trainer_without_a_state_of_its_own_has_its_announced_steps_read_and_recorded(server, client, tmp_path):
    """Fast-LLM: its backend notes each weights_ready's step and documents_seen; the live line and
    the watchdog read them, and events.jsonl keeps them for `rlrun status` and `rlrun runs`."""
    cfg, _ = compose(["trainer=fast_llm", "trainer.max_train_steps=6"])
    events = EventLog(tmp_path / "events.jsonl")
    progress = ProgressReader(server.url, server.run_dir, events, num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)
    client.set(names.POLICY_VERSION, 3)
    assert progress.read().step == 0  # nothing announced yet, no trainer state
    progress.note_trainer_step(3, 790)
    progress.note_trainer_step(3, 790)  # the same announcement read again: one event
    read = progress.read()
    assert (read.step, read.samples, read.policy_version, read.max_train_steps) == (3, 790, 3, 6)
    recorded = [line for line in (tmp_path / "events.jsonl").read_text().splitlines() if "trainer_step" in line]
    assert len(recorded) == 1 and '"step": 3' in recorded[0] and '"samples": 790' in recorded[0]
