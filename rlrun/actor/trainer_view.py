"""What the actor needs to know about the trainer, per backend (`backend_for(cfg).trainer_view`):
where a group goes, the policy version vLLM serves, whether there is room for another group
(back-pressure) and whether training is over. Fast-LLM's is `rlrun/backends/fast_llm/view.py`.
"""

from __future__ import annotations

from typing import Protocol

from rlrun.actor.partition import share
from rlrun.config import RunConfig
from rlrun.rollouts import Group
from rlrun.streams import names
from rlrun.streams.codec import encode


class TrainerView(Protocol):
    stream: str  # where finished groups go; the actor's journal shares its hash tag (names.journal_prefix)

    def destination(self, group: Group) -> tuple[str, list[str]]: ...
    def policy_version(self) -> int: ...
    def room_for_group(self, opened: int, in_flight: int) -> bool: ...
    def done(self) -> bool: ...


class HfView:
    def __init__(self, cfg: RunConfig, redis, actor: int = 0) -> None:
        self.cfg, self.redis = cfg, redis
        k = cfg.actor.num_actors
        self.stream = names.actor_stream(actor, k)
        self.groups_per_step = share(cfg.groups_per_step, actor, k)  # this actor's part of a step

    def destination(self, group: Group) -> tuple[str, list[str]]:
        return self.stream, [encode(group.to_dict())]

    def policy_version(self) -> int:
        return int(self.redis.get(names.POLICY_VERSION) or 0)

    def _state(self) -> dict:
        return self.redis.hgetall(names.TRAINER_STATE) or {}

    def room_for_group(self, opened: int, in_flight: int) -> bool:
        """Groups opened for at most `max_steps_ahead` steps beyond the trainer's next (its share of a step
        per actor), a step counted once vLLM serves its weights (overlapped updates must not run further)."""
        step = min(int(self._state().get("step", 0)), self.policy_version())
        return opened < (step + 1 + self.cfg.actor.max_steps_ahead) * self.groups_per_step

    def done(self) -> bool:
        return self._state().get("training_done") == "1"
