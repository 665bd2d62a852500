"""The hf trainer's one "done" signal (`names.TRAINING_DONE` in its state hash), against a real
Redis: the supervisor's completion check and the actor's view of the trainer read the same field,
and read it the same after Redis restarts from its AOF."""

from __future__ import annotations

import pytest

from rlrun.backends import backend_for
from rlrun.config import compose
from rlrun.parts.progress import ProgressReader
from rlrun.streams import names

pytestmark = pytest.mark.timeout(120)


def test_the_completion_check_and_the_actor_read_one_done_signal_that_survives_a_redis_restart(server, client):
    cfg, _ = compose(["trainer.max_train_steps=4"])
    check = backend_for(cfg).completion_check(cfg, ProgressReader(server.url, server.run_dir))
    view = backend_for(cfg).trainer_view(cfg, client)  # the actor's view of the trainer
    client.hset(names.TRAINER_STATE, mapping={"step": 3, "samples_processed": 10, names.TRAINING_DONE: 0})
    verdict = check({"trainer": 0})  # exit 0 short of the target, not done: a crash, restarted
    assert (verdict.finished, verdict.reject, view.done()) == (False, "trainer", False)
    assert "without training_done" in verdict.reason

    client.hset(names.TRAINER_STATE, names.TRAINING_DONE, 1)  # short of the samples target: the signal decides
    server.restart()
    assert view.done()
    verdict = check({"trainer": 0})
    assert verdict.finished and verdict.reject is None and "training_done" in verdict.reason
    assert check({"trainer": None}).finished is False  # still running (its last checkpoint): not yet
