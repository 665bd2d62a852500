"""The hf trainer's parts that need neither torch nor a live Redis, each built by its constructor:
`Stopping` (a Redis call while the trainer may be stopping) and `StatePublisher` (its state hash)."""

from __future__ import annotations

import os
import threading

import pytest
import redis

from rlrun.streams import names
from rlrun.trainer.checkpoint import TrainerState
from rlrun.trainer.intake import Position
from rlrun.trainer.published_state import StatePublisher
from rlrun.trainer.stopping import Stopping


class Redis:
    def __init__(self, gone: bool = False) -> None:
        self.hashes: dict[str, dict] = {}
        self.gone = gone

    def hset(self, key, field=None, value=None, mapping=None):
        if self.gone:
            raise redis.ConnectionError("Connection refused")
        self.hashes.setdefault(key, {}).update(mapping or {field: value})

    def hdel(self, key, *fields):
        if self.gone:
            raise redis.ConnectionError("Connection refused")
        for name in fields:
            self.hashes.get(key, {}).pop(name, None)


def lost() -> None:
    raise redis.ConnectionError("Connection refused")


def test_a_redis_lost_while_stopping_is_left_out_and_one_lost_otherwise_is_a_failure():
    assert Stopping(Redis(), threading.Event()).call(lambda: "read") == "read"
    asked = threading.Event()
    asked.set()
    assert Stopping(Redis(), asked).call(lost, default={}) == {}  # SIGTERM came first: recorded in files only
    with pytest.raises(redis.ConnectionError):
        Stopping(Redis(), threading.Event()).call(lost)  # no SIGTERM within STOP_RACE_S: a real failure


def test_a_sigterm_just_after_redis_vanished_is_a_stop_not_a_failure():
    asked = threading.Event()
    threading.Timer(0.1, asked.set).start()  # a SLURM cancel: Redis went first, our signal a moment later
    assert Stopping(Redis(), asked).call(lost, default="left out") == "left out"


def test_each_rank_heartbeats_in_its_own_field_and_rank_0_alone_publishes_progress():
    client = Redis()
    state, positions = TrainerState(step=2, samples_processed=64, policy_version=2), {"rlrun:groups": Position("9-0", 4)}
    StatePublisher(Stopping(client), rank=1, max_train_steps=5).heartbeat()
    assert list(client.hashes[names.TRAINER_STATE]) == [names.rank_heartbeat(1)]
    rank0 = StatePublisher(Stopping(client), rank=0, max_train_steps=5)
    rank0.heartbeat(waiting_for="groups (1 of 2 for step 3)")
    rank0.progress(state, positions, reward_mean=0.5)
    published = client.hashes[names.TRAINER_STATE]
    assert published["waiting_for"] == "groups (1 of 2 for step 3)" and published["pid"] == os.getpgrp()
    assert (published["step"], published["samples_processed"], published["max_train_steps"], published["reward_mean"]) == (2, 64, 5, 0.5)
    assert published[names.trained_entries("rlrun:groups")] == 4  # what the actors' back-pressure counts
    assert names.TRAINING_DONE not in published
    rank0.ready(state, positions)
    assert (published["ready_pid"], published[names.TRAINING_DONE]) == (os.getpgrp(), 0)
    rank0.done(state, positions)
    assert published[names.TRAINING_DONE] == 1


def test_a_trainer_stopping_with_its_redis_gone_still_stops_cleanly():
    asked = threading.Event()
    asked.set()
    StatePublisher(Stopping(Redis(gone=True), asked), rank=0, max_train_steps=5).heartbeat()  # left out, no raise
