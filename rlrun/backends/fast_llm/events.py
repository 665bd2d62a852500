"""Reading Fast-LLM's events stream incrementally: the last `weights_ready` step, whether
`training_finished` was seen, and how many malformed events were met (counted, never fatal)."""

from __future__ import annotations

import logging
from typing import Optional

from rlrun.backends.fast_llm.protocol import MalformedEvent, TrainingFinished, WeightsReady, parse_event

log = logging.getLogger(__name__)


class EventsReader:
    def __init__(self, redis, stream: str) -> None:
        self.redis, self.stream = redis, stream
        self.last_id = "0"
        self.last_weights_ready_step: Optional[int] = None
        self.documents_seen: Optional[int] = None
        self.training_finished_seen = False
        self.training_finished_after_step: Optional[int] = None  # the weights_ready step before it
        self.malformed = 0

    def poll(self) -> None:
        """Read every event published since the last poll (never blocks)."""
        while True:
            reply = self.redis.xread({self.stream: self.last_id}, count=500)
            if not reply:
                return
            for _stream, messages in reply:
                for message_id, fields in messages:
                    self.last_id = message_id
                    self._apply(message_id, fields)

    def _apply(self, message_id: str, fields: dict) -> None:
        try:
            event = parse_event(fields)
        except MalformedEvent as exc:
            self.malformed += 1
            log.warning("rejected event %s on %s: %s", message_id, self.stream, exc)
            return
        if isinstance(event, WeightsReady):
            self.last_weights_ready_step = event.step
            if event.documents_seen is not None:
                self.documents_seen = event.documents_seen
            self.training_finished_seen = False  # a restarted trainer is training again
        elif isinstance(event, TrainingFinished):
            self.training_finished_seen = True
            self.training_finished_after_step = self.last_weights_ready_step
