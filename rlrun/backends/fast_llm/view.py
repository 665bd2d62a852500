"""What the actor needs to know about Fast-LLM (rlrun.actor.trainer_view.TrainerView): documents go
to Fast-LLM's stream, one per sample; the policy version is the one the weight follower says vLLM
serves; back-pressure counts Fast-LLM's unread documents.
"""

from __future__ import annotations

from rlrun.actor.trainer_view import Window
from rlrun.backends.fast_llm.protocol import encode_group
from rlrun.config.schema import FastLlmConfig
from rlrun.streams import names
from rlrun.streams.rollouts import Group


class FastLlmView:
    """Fast-LLM takes more than `docs_per_step` documents per step, so back-pressure keeps the unread
    ones (the group's lag) plus those in flight under (1 + max_steps_ahead) × docs_per_step.
    `f`: trainer.fast_llm; `group_size` (algo.group_size): the documents of a group in flight."""

    def __init__(self, f: FastLlmConfig, redis, *, docs_per_step: int, max_steps_ahead: int, group_size: int) -> None:
        self.f, self.redis = f, redis
        self.stream = self.f.stream
        self.docs_per_step, self.max_steps_ahead, self.group_size = docs_per_step, max_steps_ahead, group_size

    def destination(self, group: Group) -> tuple[str, list[str]]:
        return self.f.stream, encode_group(group, self.f.loss_masking_span_end)

    def policy_version(self) -> int:
        """The step whose weights vLLM serves (set by the weight follower once they are loaded)."""
        return int(self.redis.get(names.POLICY_VERSION) or 0)

    def window(self, in_flight: int) -> Window:
        unread = self._unread_documents()
        limit = (1 + self.max_steps_ahead) * self.docs_per_step
        detail = {
            "stream": self.f.stream,
            "unread_documents": unread,
            "in_flight_groups": in_flight,
            "docs_per_step": self.docs_per_step,
        }
        return Window("documents", unread + in_flight * self.group_size, limit, detail)

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
