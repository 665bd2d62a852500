"""What the actor needs to know about the trainer, per backend (`built.backend.trainer_view`):
where a group goes, the policy version vLLM serves, whether there is room for another group
(back-pressure: `window`) and whether training is over. Fast-LLM's is `rlrun/backends/fast_llm/view.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rlrun.actor.partition import share
from rlrun.config.schema import ActorConfig
from rlrun.streams import names
from rlrun.streams.codec import encode
from rlrun.streams.rollouts import Group


@dataclass(frozen=True)
class Window:
    """Back-pressure, as one actor sees it: what it has handed the trainer that the trainer has not
    trained yet (`waiting`, in flight included), against what it may (`limit`); the actor opens a
    group while `room`. `detail`: how they were counted (diagnostics of a stalled run)."""

    unit: str  # "groups" (hf) or "documents" (Fast-LLM)
    waiting: int
    limit: int
    detail: dict = field(default_factory=dict)

    @property
    def room(self) -> bool:
        return self.waiting < self.limit


class TrainerView(Protocol):
    stream: str  # where finished groups go; the actor's journal shares its hash tag (names.journal_prefix)

    def destination(self, group: Group) -> tuple[str, list[str]]: ...
    def policy_version(self) -> int: ...
    def window(self, in_flight: int) -> Window: ...
    def done(self) -> bool: ...


class HfView:
    """Actor `actor`'s view of rlrun's own trainer; `settings`: the actor section (how many actors,
    how far ahead they may run); `groups_per_step`: the whole run's, all actors together."""

    def __init__(self, settings: ActorConfig, groups_per_step: int, redis, actor: int = 0) -> None:
        self.redis, self.max_steps_ahead = redis, settings.max_steps_ahead
        k = settings.num_actors
        self.stream = names.actor_stream(actor, k)
        self.groups_per_step = share(groups_per_step, actor, k)  # this actor's part of a step

    def destination(self, group: Group) -> tuple[str, list[str]]:
        return self.stream, [encode(group.to_dict())]

    def policy_version(self) -> int:
        return int(self.redis.get(names.POLICY_VERSION) or 0)

    def _state(self) -> dict:
        return self.redis.hgetall(names.TRAINER_STATE) or {}

    def window(self, in_flight: int) -> Window:
        """Derived from what the trainer trains next: the entries of this actor's stream beyond those
        its steps have read (set back with it when it restarts from an older checkpoint), plus the
        groups in flight, at most `1 + max_steps_ahead` steps' share, less a step whose weights vLLM
        does not serve yet (an overlapped update must not let the actor run further)."""
        state = self._state()
        step = int(state.get("step", 0))
        served = min(step, self.policy_version())
        trained = int(state.get(names.trained_entries(self.stream), 0))
        delivered = int(self.redis.xlen(self.stream))
        limit = (served - step + 1 + self.max_steps_ahead) * self.groups_per_step
        detail = {
            "stream": self.stream,
            "entries": delivered,
            "trained_entries": trained,
            "in_flight": in_flight,
            "trainer_step": step,
            "policy_version": served,
        }
        return Window("groups", max(0, delivered - trained) + in_flight, limit, detail)

    def done(self) -> bool:
        return names.training_done(self._state())
