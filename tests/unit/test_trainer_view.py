"""Back-pressure of the hf trainer view: how far the actor may run ahead of the trainer.

`actor.max_steps_ahead=0` is rlrun without asynchrony: the actor opens exactly the groups of the
step the trainer waits for, and the next step's only once the trainer has taken that step and vLLM
serves its weights, so generation and training alternate. The window counts what the trainer will
train next (its stream beyond the entries its steps have read), so a trainer set back to an older
checkpoint (a fallback past a damaged one) is fed again instead of waited for.
"""

from __future__ import annotations

from rlrun.actor.trainer_view import HfView
from rlrun.config import compose
from rlrun.streams import names


class FakeRedis:
    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str]] = {}
        self.strings: dict[str, str] = {}
        self.lengths: dict[str, int] = {}

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self.hashes.get(key, {}))

    def get(self, key: str):
        return self.strings.get(key)

    def xlen(self, key: str) -> int:
        return self.lengths.get(key, 0)

    def trainer_at(self, step: int, trained: int, served: int | None = None) -> None:
        """The trainer took `step` having read `trained` entries of the stream; vLLM serves version
        `served` (by default that step's weights)."""
        state = self.hashes.setdefault(names.TRAINER_STATE, {})
        state["step"], state[names.trained_entries(names.GROUPS_STREAM)] = str(step), str(trained)
        self.strings[names.POLICY_VERSION] = str(step if served is None else served)


def groups_the_actor_may_open(view: HfView, redis: FakeRedis, in_flight: int = 0) -> int:
    """How many groups the actor opens now, one after the other, with `in_flight` already open."""
    opened = 0
    while view.window(in_flight + opened).room:
        opened += 1
    return opened


def run_in_lockstep(view: HfView, redis: FakeRedis, per_step: int, steps: int) -> list[int]:
    """The trainer reads a step's groups once they are delivered; groups opened per step."""
    stream, opened_per_step = names.GROUPS_STREAM, []
    for step in range(steps):
        redis.trainer_at(step, step * per_step)
        opened = groups_the_actor_may_open(view, redis)
        opened_per_step.append(opened)
        redis.lengths[stream] = redis.lengths.get(stream, 0) + opened  # delivered
    return opened_per_step


def test_max_steps_ahead_0_opens_only_the_step_the_trainer_waits_for():
    cfg, _ = compose(["recipe=math_gspo", "actor.max_steps_ahead=0"])
    per_step = cfg.groups_per_step
    assert per_step == 16  # 256 samples per step / groups of 16
    redis = FakeRedis()
    view = HfView(cfg.actor, cfg.groups_per_step, redis)
    assert view.window(per_step - 1).room and not view.window(per_step).room  # no trainer state yet: step 0
    assert run_in_lockstep(view, redis, per_step, 4) == [per_step] * 4  # one step's groups, then the next


def test_max_steps_ahead_1_keeps_one_more_step_in_flight():
    cfg, _ = compose(["recipe=math_grpo", "actor.max_steps_ahead=1"])
    per_step = cfg.groups_per_step
    redis = FakeRedis()
    view = HfView(cfg.actor, cfg.groups_per_step, redis)
    assert run_in_lockstep(view, redis, per_step, 3) == [2 * per_step, per_step, per_step]
    redis.trainer_at(5, 5 * per_step)
    redis.lengths[names.GROUPS_STREAM] = 5 * per_step
    assert groups_the_actor_may_open(view, redis) == 2 * per_step
    assert groups_the_actor_may_open(view, redis, in_flight=per_step) == per_step  # in flight counts


def test_a_step_counts_once_vllm_serves_its_weights():
    """trainer.overlap_weight_update: the trainer publishes step 5 while vLLM still loads v5."""
    for ahead in (0, 1):
        cfg, _ = compose(["recipe=math_grpo", f"actor.max_steps_ahead={ahead}"])
        per_step = cfg.groups_per_step
        redis = FakeRedis()
        view = HfView(cfg.actor, cfg.groups_per_step, redis)
        redis.lengths[names.GROUPS_STREAM] = 5 * per_step
        redis.trainer_at(5, 5 * per_step, served=4)
        assert groups_the_actor_may_open(view, redis) == ahead * per_step
        redis.trainer_at(5, 5 * per_step, served=5)
        assert groups_the_actor_may_open(view, redis) == (1 + ahead) * per_step


def test_a_trainer_set_back_to_an_older_checkpoint_is_fed_again_then_the_actor_goes_on():
    """The trainer read 24 steps' groups, then fell back to step 10 (its checkpoint of step 20 was
    damaged): the 14 steps' groups after step 10 are in the stream again for it, so the actor waits
    while they are read again and opens the next ones as the trainer catches up; counting the
    groups ever opened (the old rule) it would wait for ever for a trainer waiting for it."""
    cfg, _ = compose(["recipe=math_grpo", "actor.max_steps_ahead=1"])
    per_step = cfg.groups_per_step
    redis = FakeRedis()
    view = HfView(cfg.actor, cfg.groups_per_step, redis)
    redis.lengths[names.GROUPS_STREAM] = 26 * per_step  # delivered while the first trainer ran
    redis.trainer_at(24, 24 * per_step)
    assert groups_the_actor_may_open(view, redis) == 0  # two steps ahead already
    redis.trainer_at(10, 10 * per_step, served=10)  # the restarted trainer, set back
    window = view.window(0)
    assert not window.room and window.waiting == 16 * per_step and window.detail["trained_entries"] == 10 * per_step
    for step in range(11, 25):  # it reads them again, a step at a time
        redis.trainer_at(step, step * per_step)
        assert groups_the_actor_may_open(view, redis) == 0
    redis.trainer_at(25, 25 * per_step)
    assert groups_the_actor_may_open(view, redis) == per_step  # fed again: generation goes on
