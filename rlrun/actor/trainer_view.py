"""What the actor needs to know about the trainer, per trainer backend.

- where to send a finished group (stream and messages),
- the policy version vLLM serves now (tokens are tagged with it),
- whether there is room for another group (back-pressure),
- whether training is over.

The `hf` trainer publishes its step in a Redis hash and the policy version in a key; under
Fast-LLM the weight follower publishes the version once vLLM has loaded Fast-LLM's broadcast,
and Fast-LLM reads documents, one per sample, from its own stream. The actor itself is the same for both.
"""

from __future__ import annotations

from typing import Protocol

from rlrun.config import RunConfig
from rlrun.rollouts import Group
from rlrun.streams import names
from rlrun.streams.codec import encode


class TrainerView(Protocol):
    def destination(self, group: Group) -> tuple[str, list[str]]: ...
    def policy_version(self) -> int: ...
    def room_for_group(self, opened: int, in_flight: int) -> bool: ...
    def done(self) -> bool: ...


class HfView:
    def __init__(self, cfg: RunConfig, redis) -> None:
        self.cfg, self.redis = cfg, redis

    def destination(self, group: Group) -> tuple[str, list[str]]:
        return names.GROUPS_STREAM, [encode(group.to_dict())]

    def policy_version(self) -> int:
        return int(self.redis.get(names.POLICY_VERSION) or 0)

    def _state(self) -> dict:
        return self.redis.hgetall(names.TRAINER_STATE) or {}

    def room_for_group(self, opened: int, in_flight: int) -> bool:
        """Groups for at most `max_steps_ahead` steps beyond the trainer's next, counted in groups
        opened (delivered + in flight: the journal replays in-flight groups, never loses them)."""
        step = int(self._state().get("step", 0))
        return opened < (step + 1 + self.cfg.actor.max_steps_ahead) * self.cfg.groups_per_step

    def done(self) -> bool:
        return self._state().get("training_done") == "1"


class FastLlmView:
    """Fast-LLM: documents to its stream, the version vLLM serves, back-pressure by lag.

    Fast-LLM takes more documents per step than `docs_per_step` (whole micro-batches), so the
    actor cannot count steps × documents: it keeps the documents Fast-LLM has not read yet (the
    consumer group's lag) plus those in flight under `(1 + max_steps_ahead) × docs_per_step`.
    It never decides that training is over: the supervisor's completion rule does, and stops it.
    """

    def __init__(self, cfg: RunConfig, redis) -> None:
        from rlrun.backends.fast_llm.config import docs_per_step

        self.cfg, self.redis = cfg, redis
        self.f = cfg.trainer.fast_llm
        self.docs_per_step = docs_per_step(cfg)

    def destination(self, group: Group) -> tuple[str, list[str]]:
        from rlrun.backends.fast_llm.protocol import encode_group

        return self.f.stream, [fields["data"] for fields in encode_group(group, self.f.loss_masking_span_end)]

    def policy_version(self) -> int:
        """The step whose weights vLLM serves (set by the weight follower once they are loaded;
        `weights_ready` alone only says the broadcast is about to start)."""
        return int(self.redis.get(names.POLICY_VERSION) or 0)

    def room_for_group(self, opened: int, in_flight: int) -> bool:
        unread = self._unread_documents()
        return unread + in_flight * self.cfg.algo.group_size < (1 + self.cfg.actor.max_steps_ahead) * self.docs_per_step

    def _unread_documents(self) -> int:
        try:
            groups = self.redis.xinfo_groups(self.f.stream)
        except Exception:  # noqa: BLE001 - no stream yet: nothing unread
            return 0
        for group in groups:
            if group.get("name") == self.f.consumer_group and group.get("lag") is not None:
                return int(group["lag"])
        return int(self.redis.xlen(self.f.stream))  # Fast-LLM has not joined yet: all of it

    def done(self) -> bool:
        return False


def trainer_view(cfg: RunConfig, redis) -> TrainerView:
    return FastLlmView(cfg, redis) if cfg.trainer.backend == "fast_llm" else HfView(cfg, redis)
