"""The hf trainer's one "done" signal, against a real Redis: what the trainer's StatePublisher
writes (`names.TRAINING_DONE` in its state hash) is what the supervisor's completion check and the
actor's view of the trainer read, the same after Redis restarts from its AOF; a new trainer clears
the one an earlier trainer left."""

from __future__ import annotations

import pytest

from rlrun.config import compose
from rlrun.parts.progress import ProgressReader
from rlrun.run.built import build
from rlrun.trainer.checkpoint import TrainerState
from rlrun.trainer.intake import Position
from rlrun.trainer.published_state import StatePublisher
from rlrun.trainer.stopping import Stopping

pytestmark = pytest.mark.timeout(120)


def test_the_completion_check_and_the_actor_read_the_trainers_one_done_signal(server, client):
    cfg, _ = compose(["trainer.max_train_steps=4"])
    backend = build(cfg).backend
    check = backend.completion_check(ProgressReader(server.url, server.run_dir, num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps))
    view = backend.trainer_view(client)  # the actor's view of the trainer
    published = StatePublisher(Stopping(client), rank=0, max_train_steps=4)
    short = TrainerState(step=3, samples_processed=10, policy_version=3)  # far below the samples target
    positions = {"rlrun:groups": Position("5-0", 10)}

    published.done(short, positions)  # an earlier trainer's, left in Redis
    published.ready(short, positions)  # this one is up
    verdict = check({"trainer": 0})  # exit 0 short of the target, not done: a crash, restarted
    assert (verdict.finished, verdict.reject, view.done()) == (False, "trainer", False)
    assert "without training_done" in verdict.reason

    published.done(short, positions)  # short of the samples target: the signal decides
    server.restart()
    assert view.done()
    verdict = check({"trainer": 0})
    assert verdict.finished and verdict.reject is None and "training_done" in verdict.reason
    assert check({"trainer": None}).finished is False  # still running (its last checkpoint): not yet
