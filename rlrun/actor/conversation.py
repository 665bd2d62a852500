"""Pure rules of a conversation (environment.step): a turn's token budget, the chat messages the
environment is shown, and what the environment's answer does to the conversation.

A conversation's tokens after the prompt are exactly what the next request's prompt was built
from: each model turn's ids as vLLM sampled them, each observation's ids as they were rendered
(`rlrun/task/turns.py`), never the whole conversation re-tokenized. Observations are masked from
the loss by the trainer (`Sample.observation_spans`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from rlrun.actor.sampling import SampleState
from rlrun.task.environment import INTERRUPTED, Step, StepCall, TurnInfo, as_step
from rlrun.task.pool import CallFailed
from rlrun.task.turns import Observation, parse_tool_calls

log = logging.getLogger("rlrun.actor")

if TYPE_CHECKING:
    from rlrun.task.pool import RewardPool
    from rlrun.task.turns import TurnFormat


@dataclass(frozen=True)
class Limits:
    """environment.* and actor.* limits of one conversation."""

    max_turns: int
    max_total_tokens: int  # after the prompt: model turns and observations
    max_turn_tokens: int  # one model turn (actor.max_new_tokens)
    max_observation_tokens: int


def turn_budget(sample: SampleState, limits: Limits) -> int:
    """Tokens the next request may generate for `sample`'s current turn (0: none left)."""
    in_turn = len(sample.completion_ids) - sample.turn_start
    return max(0, min(limits.max_turn_tokens - in_turn, limits.max_total_tokens - len(sample.completion_ids)))


def is_last_turn(sample: SampleState, limits: Limits) -> bool:
    """No other model turn can follow the one that just ended: the turn limit, or no token left."""
    return len(sample.turn_ends) >= limits.max_turns or len(sample.completion_ids) >= limits.max_total_tokens


@dataclass(frozen=True)
class Outcome:
    """What the actor does with a step's answer: go on with `observation` (content already cut to
    its limit, `truncated` saying so), or end the conversation with `reward` (`finish_reason`:
    "stop" when the environment said done, "length" when a limit ended it)."""

    observation: Optional[Step] = None
    truncated: bool = False
    finish_reason: Optional[str] = None
    reward: float = 0.0


def outcome_of(step: Step, last: bool) -> Outcome:
    """The environment said done, or it was the last turn (its reward, or 0), or the conversation goes on."""
    if step.done:
        return Outcome(finish_reason="stop", reward=float(step.reward or 0.0))
    if last:
        return Outcome(finish_reason="length", reward=float(step.reward or 0.0))
    return Outcome(observation=step)


def fits(sample: SampleState, observation_tokens: int, limits: Limits) -> bool:
    """Is there room for the observation and at least one token of the next turn?"""
    return len(sample.completion_ids) + observation_tokens < limits.max_total_tokens


def messages_for(
    prompt, sample: SampleState, decode: Callable[[list[int]], str], parse_calls: Callable[[str], list]
) -> list[dict]:
    """The conversation as chat messages, as the environment is shown it: the prompt's, then each
    model turn (its text and the tool calls in it) and each observation, in order."""
    messages: list[dict[str, Any]] = (
        [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    )
    start = 0
    answers = {o["start"]: o for o in sample.observations if o["end"] > o["start"]}
    for end, _ in sample.turn_ends:
        text = decode(sample.completion_ids[start:end])
        calls = [{"name": c.name, "arguments": c.arguments} for c in parse_calls(text)]
        messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        observation = answers.get(end)
        if observation is not None:
            message = {"role": observation["role"], "content": observation["content"]}
            if observation.get("name"):
                message["name"] = observation["name"]
            messages.append(message)
            start = observation["end"]
        else:
            start = end
    return messages


@dataclass
class Conversations:
    """What an actor of a run with an environment holds: the step workers, the chat format the
    observations are rendered in, the tools shown to the model, the limits."""

    pool: "RewardPool"  # environment.workers processes running the step function
    turns: "TurnFormat"
    limits: Limits
    tools: list
    timeout_s: float

    @property
    def rerun_interrupted(self) -> bool:
        """What the step function says (known once the pool started)."""
        return bool(self.pool.conventions[0]) if self.pool.conventions else True


async def take_step(talk: Conversations, sample: SampleState, problem, group_id: str, decode, counters: dict) -> None:
    """Run the environment's step for `sample`'s last turn (in a worker) and apply its answer:
    the observation's ids appended (`observe`), or the conversation finished with its reward
    (`finish`). Journaling it is the caller's. A step a crash cut is run again only where the step
    function allows it; a timeout is told to the model; a step that raised ends it with reward 0.
    `counters` (the actor's env_* counts) are added to."""
    last = is_last_turn(sample, talk.limits)
    if sample.step_interrupted and not talk.rerun_interrupted:
        counters["env_steps_interrupted"] += 1
        answer: Optional[Step] = Step(observation=INTERRUPTED)
    else:
        counters["env_steps_rerun"] += int(sample.step_interrupted)
        answer = await _run_step(talk, sample, problem, group_id, decode, last, counters)
    if answer is None:  # the step raised
        finish(sample, "stop", 0.0)
        return
    outcome = outcome_of(answer, last)
    if outcome.finish_reason is not None:
        finish(sample, outcome.finish_reason, outcome.reward)
        return
    step = outcome.observation
    assert step is not None and step.observation is not None  # not done: the step answered text (checked when read)
    content, truncated = talk.turns.truncate(step.observation, talk.limits.max_observation_tokens)
    counters["observations_truncated"] += int(truncated)
    observation = Observation(content, step.role, step.name)
    # Whether the turn ends as the template ends one: its end-of-turn id sampled (not another stop
    # id, such as Qwen's <|endoftext|>), else the observation's ids close the turn first.
    end_of_turn = list(talk.turns.end_of_turn_ids)
    stopped = (
        sample.turn_end == "stop"
        and sample.completion_ids[len(sample.completion_ids) - len(end_of_turn) :] == end_of_turn
    )
    ids = talk.turns.observation_ids(observation, model_stopped=stopped)
    if not fits(sample, len(ids), talk.limits):  # no room for it and a next turn: the budget ends it
        finish(sample, "length", 0.0)
        return
    sample.observe(
        ids, {"role": observation.role, "content": content, "name": observation.name, "truncated": truncated}
    )


async def _run_step(
    talk: Conversations, sample: SampleState, problem, group_id: str, decode, last: bool, counters: dict
) -> Optional[Step]:
    """The environment's answer; a timeout becomes an observation saying so; None: the step raised."""
    info = TurnInfo(
        group_id,
        sample.index,
        len(sample.turn_ends),
        sample.turn_end or "length",
        len(sample.completion_ids),
        last,
        max(sample.versions, default=0),
    )
    call = StepCall(messages_for(problem.prompt, sample, decode, parse_tool_calls), problem.row, info, talk.tools)
    counters["env_steps"] += 1
    try:
        return as_step(await talk.pool.call(0, call))
    except CallFailed as exc:
        if exc.kind == "timeout":
            counters["env_step_timeouts"] += 1
            return Step(observation=f"the step timed out after {talk.timeout_s:g} s")
        if exc.kind == "interrupted":  # its worker died under it, and it must not run twice
            counters["env_steps_interrupted"] += 1
            return Step(observation=INTERRUPTED)
        counters["env_step_errors"] += 1
        if counters["env_step_errors"] == 1:  # the first; the counter says how many followed
            log.error(
                "environment.step raised (the conversation ends with reward 0; counted in env_step_errors):\n%s",
                exc.detail,
            )
        return None


def finish(sample: SampleState, finish_reason: str, reward: float) -> None:
    """The last step: the conversation ends with its reward (a payload without tokens)."""
    end = len(sample.completion_ids)
    sample.observations.append({"done": True, "reward": reward, "start": end, "end": end})
    sample.turn_end, sample.step_interrupted = None, False
    sample.finish_reason, sample.reward = finish_reason, reward


def conversations_for(cfg, model_path: str, tokenizer) -> Conversations | None:
    """The run's conversations (None without environment.step): the model's chat format, or the
    plain one of a model without a chat template (its end-of-sequence id from config.json)."""
    from rlrun.task.environment import load_tools
    from rlrun.task.pool import RewardPool
    from rlrun.task.turns import chat_turn_format, plain_turn_format

    env = cfg.environment
    if not env.step:
        return None
    turns: TurnFormat
    if cfg.model.chat_template:
        turns = chat_turn_format(model_path, tokenizer)
    else:
        turns = plain_turn_format(tokenizer, end_of_sequence_id(model_path))
    limits = Limits(env.max_turns, env.max_total_tokens, cfg.actor.max_new_tokens, env.max_observation_tokens)
    pool = RewardPool([env.step], env.workers, env.timeout_s, environment=True)
    return Conversations(pool, turns, limits, load_tools(env.tools), env.timeout_s)


def end_of_sequence_id(model_path: str) -> int:
    import json
    from pathlib import Path

    eos = json.loads((Path(model_path) / "config.json").read_text()).get("eos_token_id")
    return int(eos[0] if isinstance(eos, list) else eos)
