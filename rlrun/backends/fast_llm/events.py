"""Fast-LLM's events, checked against the run before anyone acts on them.

Fast-LLM's clients have no password, so any local process may append to the events stream: the
completion rule and the weight follower act only on events that fit the current trainer attempt
(`weights_ready` from its `join_step` on, in order, never past `train_iters`; then one
`training_finished`). Anything else is counted and ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from rlrun.backends.fast_llm.protocol import Event, MalformedEvent, TrainingFinished, WeightsReady, parse_event
from rlrun.streams import names

log = logging.getLogger(__name__)


def stream_id_after(a: str, b: str) -> bool:
    ams, _, aseq = a.partition("-")
    bms, _, bseq = b.partition("-")
    return (int(ams), int(aseq or 0)) > (int(bms), int(bseq or 0))


def weights_ready_problem(
    step: int, *, last_step: Optional[int], start_step: Optional[int], train_iters: int, skips_possible: bool
) -> Optional[str]:
    """Why a `weights_ready` of `step` does not fit the current attempt, or None when it does."""
    if last_step is None:  # its first: the step it resumed from (past train_iters after a lowered target)
        if start_step is not None:
            return (
                None
                if step == start_step
                else f"the trainer started from step {start_step}, its first announcement cannot be step {step}"
            )
        return None if step <= train_iters else f"step {step} is past train_iters ({train_iters})"
    if step > train_iters:
        return f"step {step} is past train_iters ({train_iters})"
    if step <= last_step:
        return f"step {step} goes backwards (the last step announced was {last_step})"
    if step != last_step + 1 and not skips_possible:
        return f"step {step} jumps from step {last_step} (expected {last_step + 1})"
    return None


@dataclass
class Attempt:
    """What the current trainer attempt has announced so far."""

    after: Optional[str] = None  # events up to this id came from earlier trainers
    start_step: Optional[int] = None  # the step it resumes from (None: unknown)
    last_step: Optional[int] = None  # its last accepted weights_ready step
    finished: bool = False  # its training_finished was seen


class EventJudge:
    """Decides, event by event, what the current trainer attempt really said (pure: no I/O)."""

    def __init__(self, train_iters: int, skips_possible: bool = False) -> None:
        self.train_iters, self.skips_possible = train_iters, skips_possible
        self.attempt = Attempt()

    def new_attempt(self, after: Optional[str], start_step: Optional[int], last_step: Optional[int] = None) -> None:
        """A trainer (re)start recorded by the supervisor (`last_step`: a restarted reader's memory)."""
        self.attempt = Attempt(after=after, start_step=start_step, last_step=last_step)

    def judge(self, message_id: str, fields) -> tuple[Optional[Event], Optional[str]]:
        """(the event to act on, None) | (None, why it is rejected) | (None, None) for an earlier
        trainer's event. Accepting updates the attempt."""
        a = self.attempt
        if a.after is not None and not stream_id_after(message_id, a.after):
            return None, None
        try:
            event = parse_event(fields)
        except MalformedEvent as exc:
            return None, str(exc)
        if isinstance(event, WeightsReady):
            why = weights_ready_problem(
                event.step,
                last_step=a.last_step,
                start_step=a.start_step,
                train_iters=self.train_iters,
                skips_possible=self.skips_possible,
            )
            if why is not None:
                return None, f"weights_ready does not fit the run: {why}"
            a.last_step, a.finished = event.step, False
            return event, None
        if isinstance(event, TrainingFinished):
            if a.last_step is None:
                return None, "training_finished before this trainer announced any weights_ready"
            if a.finished:
                return None, "a second training_finished from the same trainer"
            a.finished = True
            return event, None
        return None, f"unknown event {event!r}"  # parse_event only returns the two kinds above


class EventsReader:
    """What the current trainer attempt announced, for the completion rule; `on_rejected(id, why)`
    for every event that does not fit (also counted in `rejected`)."""

    def __init__(
        self,
        redis,
        stream: str,
        train_iters: int,
        skips_possible: bool = False,
        on_rejected: Optional[Callable[[str, str], None]] = None,
    ) -> None:
        self.redis, self.stream = redis, stream
        self.judge = EventJudge(train_iters, skips_possible)
        self.on_rejected = on_rejected
        self.last_id = "0"
        self.documents_seen: Optional[int] = None
        self.rejected = 0

    @property
    def last_weights_ready_step(self) -> Optional[int]:
        return self.judge.attempt.last_step

    @property
    def training_finished_seen(self) -> bool:
        return self.judge.attempt.finished

    def poll(self) -> None:
        state = self.redis.hgetall(names.WEIGHTS_STATE) or {}  # the attempt the supervisor recorded
        after, step = state.get("join_after"), state.get("join_step")
        if after != self.judge.attempt.after:
            self.judge.new_attempt(after, int(step) if step else None)
        while True:
            reply = self.redis.xread({self.stream: self.last_id}, count=500)
            if not reply:
                return
            for _stream, messages in reply:
                for message_id, fields in messages:
                    self.last_id = message_id
                    self._apply(message_id, fields)

    def _apply(self, message_id: str, fields: dict) -> None:
        event, why = self.judge.judge(message_id, fields)
        if why is not None:
            self.rejected += 1
            log.warning("rejected event %s on %s: %s", message_id, self.stream, why)
            if self.on_rejected is not None:
                self.on_rejected(message_id, why)
        elif isinstance(event, WeightsReady) and event.documents_seen is not None:
            self.documents_seen = event.documents_seen
