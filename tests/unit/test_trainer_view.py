"""Back-pressure of the hf trainer view: how far the actor may run ahead of the trainer.

`actor.max_steps_ahead=0` is rlrun without asynchrony: the actor opens exactly the groups of the
step the trainer waits for, and the next step's only once the trainer has taken that step and vLLM
serves its weights, so generation and training alternate.
"""

from __future__ import annotations

from rlrun.actor.trainer_view import HfView
from rlrun.config import compose
from rlrun.streams import names


class FakeRedis:
    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str]] = {}
        self.strings: dict[str, str] = {}

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self.hashes.get(key, {}))

    def get(self, key: str):
        return self.strings.get(key)

    def set_step(self, step: int, served: int | None = None) -> None:
        """The trainer took `step`; vLLM serves version `served` (by default that step's weights)."""
        self.hashes.setdefault(names.TRAINER_STATE, {})["step"] = str(step)
        self.strings[names.POLICY_VERSION] = str(step if served is None else served)


def groups_the_actor_may_open(view: HfView, redis: FakeRedis, step: int, served: int | None = None) -> int:
    redis.set_step(step, served)
    opened = 0
    while view.room_for_group(opened, in_flight=0):
        opened += 1
    return opened


def test_max_steps_ahead_0_opens_only_the_step_the_trainer_waits_for():
    cfg, _ = compose(["recipe=math_gspo", "actor.max_steps_ahead=0"])
    per_step = cfg.groups_per_step
    assert per_step == 16  # 256 samples per step / groups of 16
    redis = FakeRedis()
    view = HfView(cfg, redis)
    assert view.room_for_group(per_step - 1, 0) and not view.room_for_group(per_step, 0)  # no trainer state yet: step 0
    for step in range(4):  # while step `step + 1` trains, nothing more is opened
        assert groups_the_actor_may_open(view, redis, step) == (step + 1) * per_step


def test_max_steps_ahead_1_keeps_one_more_step_in_flight():
    cfg, _ = compose(["recipe=math_grpo", "actor.max_steps_ahead=1"])
    redis = FakeRedis()
    view = HfView(cfg, redis)
    assert groups_the_actor_may_open(view, redis, 0) == 2 * cfg.groups_per_step
    assert groups_the_actor_may_open(view, redis, 5) == 7 * cfg.groups_per_step


def test_a_step_counts_once_vllm_serves_its_weights():
    """trainer.overlap_weight_update: the trainer publishes step 5 while vLLM still loads v5."""
    for ahead in (0, 1):
        cfg, _ = compose(["recipe=math_grpo", f"actor.max_steps_ahead={ahead}"])
        redis = FakeRedis()
        view = HfView(cfg, redis)
        assert groups_the_actor_may_open(view, redis, 5, served=4) == (4 + 1 + ahead) * cfg.groups_per_step
        assert groups_the_actor_may_open(view, redis, 5, served=5) == (5 + 1 + ahead) * cfg.groups_per_step
