"""What the hf trainer tells the rest of the run in its state hash (`names.TRAINER_STATE`): every
rank's heartbeat (the liveness probe wants each fresh) and what it waits for; the weight update in
flight (to which version, since when); rank 0's progress, the entries of each stream its steps read
(the actors' back-pressure, `actor/trainer_view.py`), `ready_pid` and the one "done" signal
(`names.TRAINING_DONE`).
"""

from __future__ import annotations

import os
import time

from rlrun.streams import names
from rlrun.trainer.checkpoint import TrainerState
from rlrun.trainer.intake import Position
from rlrun.trainer.stopping import Stopping


class StatePublisher:
    def __init__(self, stopping: Stopping, rank: int, max_train_steps: int) -> None:
        self.stopping, self.rank, self.max_train_steps = stopping, rank, max_train_steps

    def heartbeat(self, waiting_for: str = "") -> None:
        """Rank 0 writes `pid`, `heartbeat` and what it waits for (diagnostics of a stalled run); rank
        r>0 `heartbeat_rank<r>`."""
        redis = self.stopping.redis
        if self.rank == 0:
            mapping = {"pid": os.getpgrp(), "heartbeat": time.time(), "waiting_for": waiting_for}
            self.stopping.call(lambda: redis.hset(names.TRAINER_STATE, mapping=mapping))
        else:
            self.stopping.call(lambda: redis.hset(names.TRAINER_STATE, names.rank_heartbeat(self.rank), time.time()))

    def updating(self, version: int | None) -> None:
        """Rank 0 hands policy `version` to vLLM from now on (None: that update ended, done or not)."""
        redis = self.stopping.redis
        if version is None:
            self.stopping.call(
                lambda: redis.hdel(names.TRAINER_STATE, names.UPDATING_WEIGHTS_TO, names.UPDATING_WEIGHTS_SINCE)
            )
        else:
            mapping = {names.UPDATING_WEIGHTS_TO: version, names.UPDATING_WEIGHTS_SINCE: time.time()}
            self.stopping.call(lambda: redis.hset(names.TRAINER_STATE, mapping=mapping))

    def progress(self, state: TrainerState, positions: dict[str, Position], **extra) -> None:
        """Rank 0's progress, and per stream the entries the steps taken read."""
        mapping = {
            **{names.trained_entries(s): p.entries_read for s, p in positions.items()},
            "step": state.step,
            "samples_processed": state.samples_processed,
            "policy_version": state.policy_version,
            "max_train_steps": self.max_train_steps,
            "pid": os.getpgrp(),  # the group the supervisor started (its guard leads it)
            "heartbeat": time.time(),
            **extra,
        }
        self.stopping.call(lambda: self.stopping.redis.hset(names.TRAINER_STATE, mapping=mapping))

    def ready(self, state: TrainerState, positions: dict[str, Position]) -> None:
        """Every rank is up: the supervisor's readiness probe reads `ready_pid`. A done signal an
        earlier trainer left is cleared: it is not this one's, not yet; so is an update it left unfinished."""
        self.updating(None)
        self.progress(state, positions, ready_pid=os.getpgrp(), **{names.TRAINING_DONE: 0})

    def done(self, state: TrainerState, positions: dict[str, Position]) -> None:
        """The last step is taken and vLLM serves its weights: the completion check and the actors
        read this (`names.training_done`)."""
        self.progress(state, positions, **{names.TRAINING_DONE: 1})
