"""Step functions for tests of the environment's worker pool (tests/integration/test_reward_pool.py)."""

import time

from rlrun.task.environment import Step


def echo(messages, row, info):
    """Answers with the last model turn and the row's answer; done at turn 3, rewarded 1 when right."""
    if info.turn >= 3:
        return {"done": True, "reward": float(messages[-1]["content"] == row["answer"])}
    return {"observation": f"{messages[-1]['content']}|{row['answer']}|{info.group_id}#{info.index}", "role": "tool", "name": "echo"}


def charge(messages, row, info):
    """A side effect that must not happen twice: a call a crash cut is not run again."""
    return Step(observation="charged", role="user")


charge.rerun_interrupted = False


async def later(messages, row, info):
    return Step(done=True, reward=0.25)


def number(messages, row, info):
    return 3.0


def misspelt(messages, row, info):
    return {"obs": "5"}


def no_observation(messages, row, info):
    return {"role": "tool"}


def sleepy(messages, row, info):
    if messages[-1]["content"] == "sleep":
        time.sleep(60)
    return {"observation": "awake"}


def two_arguments(messages, row):
    return {"done": True}


def _dying(messages, row, info):
    """Notes its call in $RLRUN_STEP_CALLS, then its worker dies (a segfault, an OOM kill)."""
    import os

    with open(os.environ["RLRUN_STEP_CALLS"], "a") as handle:
        handle.write(f"{info.group_id}\n")
    os._exit(1)


def dies(messages, row, info):
    return _dying(messages, row, info)


def dies_charging(messages, row, info):
    return _dying(messages, row, info)


dies_charging.rerun_interrupted = False
