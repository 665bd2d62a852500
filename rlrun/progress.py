"""A run's progress as the supervisor sees it: what the trainer and the actors publish in Redis,
and the trainer's events stream. Feeds the live view and the completion check; tolerant of Redis
being down or restarting (the last values read are kept).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional

from rlrun.config import RunConfig
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams import server as redis_server
from rlrun.streams.tail import StreamTail
from rlrun.supervisor import EventLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """What the live view shows of training, read from the trainer's published state."""

    step: int = 0
    max_train_steps: int = 0
    samples: int = 0
    reward_mean: Optional[float] = None
    policy_version: int = 0
    groups_published: int = 0


class ProgressReader:
    def __init__(self, url: str, run_dir: RunDir, events: Optional[EventLog] = None) -> None:
        self._url = url
        self.run_dir = run_dir
        self._client = None
        self._events = events
        # This launch's events only: a resumed run's stream still holds the previous launch's.
        # Stream ids start with the server's time in ms: read from this millisecond on.
        self._trainer_events = StreamTail(names.TRAINER_EVENTS, "event", start_id=f"{int(time.time() * 1000) - 1}-{2**64 - 1}")
        self.training_done_seen = False
        self.malformed_events = 0
        self._last: dict[str, dict] = {}  # the last value read of each hash

    def poll_trainer_events(self) -> bool:
        """Read the trainer's new events (malformed ones counted); True once `training_done` was seen."""
        try:
            polled = self._trainer_events.poll(self.redis())
        except Exception:  # Redis not up yet, or restarting: read on from the same id next time
            self._client = None
            return self.training_done_seen
        for message_id, why in polled.malformed:
            log.warning("rejected message %s on %s: %s", message_id, names.TRAINER_EVENTS, why)
            self.note_rejected_event(names.TRAINER_EVENTS, message_id, why)
        if any(message.get("type") == "training_done" for _id, message in polled.messages):
            self.training_done_seen = True
        return self.training_done_seen

    def note_rejected_event(self, stream: str, message_id: str, why: str) -> None:
        """An event that is malformed or does not fit the run: counted, recorded, never acted on."""
        self.malformed_events += 1
        if self._events is not None:
            self._events.emit("malformed_message", stream=stream, id=message_id, reason=why, count=self.malformed_events)

    def redis(self):
        """A client for the run's Redis (made on first use, again after a failure)."""
        if self._client is None:
            password = self.run_dir.read_redis_password()
            self._client = redis_server.connect(self._url, password, socket_timeout=2.0, reconnect_s=0)
        return self._client

    def trainer_state(self) -> dict:
        return self._hash(names.TRAINER_STATE)

    def read(self, cfg: RunConfig) -> Progress:
        t = self._hash(names.TRAINER_STATE)
        actors = [self._hash(key) for key in names.actor_states(cfg.actor.num_actors)]
        reward = t.get("reward_mean")
        return Progress(
            step=int(t.get("step", 0)),
            max_train_steps=cfg.trainer.max_train_steps,
            samples=int(t.get("samples_processed", 0)),
            reward_mean=float(reward) if reward is not None else None,
            policy_version=int(t.get("policy_version", 0)),
            groups_published=sum(int(a.get("groups_published", 0) or 0) for a in actors),
        )

    def _hash(self, key: str) -> dict:
        try:
            value = self.redis().hgetall(key) or {}
        except Exception:  # Redis not up yet, restarting or stopped: what was read last
            self._client = None
            return self._last.get(key, {})
        # Kept so that the end of a run (Redis stopped) still shows the final step and reward.
        self._last[key] = value
        return value
