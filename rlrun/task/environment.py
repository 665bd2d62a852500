"""Environments: rollouts of several turns (`environment.step`).

After every model turn the environment is called with the conversation so far and answers with
the next observation (a tool's result, feedback) or with done and the conversation's reward:

    def step(messages: list[dict], row: dict, info: TurnInfo) -> dict | Step

(or a verifier's server: `environment.step=http://127.0.0.1:8000/step`, `ServedStep`)

`messages` are chat messages: the prompt's, then each model turn as `{"role": "assistant",
"content": text, "tool_calls": [{"name", "arguments"}]}` (calls written in the
`<tool_call>{...}</tool_call>` format) and each earlier observation. It returns
`{"observation": text, "role": "tool" | "user", "name": tool}` or `{"done": True, "reward": x}`
(a `Step`, or a dict of its fields); `async def` works too. Like a reward it runs in worker
processes (`rlrun/task/pool.py`), never in the actor's event loop, and the journal records every
answer: a step that returned is never run again, whatever restarts. A step interrupted by a crash
is run again unless the function says it must not be (`step.rerun_interrupted = False`: a side
effect that must not happen twice); then the model is told it was interrupted.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional

from rlrun.task.rows import TaskInputError

ROLES = ("tool", "user")
INTERRUPTED = "the call was interrupted (the run restarted) and is not run again"


@dataclass(frozen=True)
class TurnInfo:
    """What the actor knows of the turn that just ended, besides the conversation."""

    group_id: str
    index: int  # the conversation's position in its group
    turn: int  # model turns so far, this one included (1 after the first)
    finish_reason: str  # how the model's turn ended: "stop" (it ended it) or "length" (turn budget spent)
    num_tokens: int  # the conversation's tokens after the prompt (model and observations)
    last: bool  # no other turn follows whatever the step answers (environment.max_turns or the token budget)
    policy_version: int = 0


@dataclass(frozen=True)
class Step:
    """What a step answers: an observation for the model, or done with the reward."""

    observation: Optional[str] = None
    role: str = "tool"  # "tool": a tool's result; "user": the environment speaking
    name: Optional[str] = None  # the tool's name (templates that render it)
    done: bool = False
    reward: Optional[float] = None  # read when done (a last turn's observation ends it as 0 but for this)


@dataclass(frozen=True)
class StepCall:
    """One call of the environment, as it crosses to a worker process."""

    messages: list[dict]
    row: Mapping[str, Any]
    info: TurnInfo
    tools: list[dict] = field(default_factory=list)


def call_step(function: Callable, call: StepCall) -> dict:
    """Run one step (in a worker) and return its answer checked, as a `Step`'s fields."""
    answer = function(call.messages, dict(call.row), call.info)
    if inspect.isawaitable(answer):
        answer = asyncio.run(_awaited(answer))
    return asdict(as_step(answer))


async def _awaited(answer):
    return await answer


def as_step(answer: Any) -> Step:
    """A step function's answer as a `Step`; TypeError or ValueError saying what is wrong."""
    if isinstance(answer, Step):
        step = answer
    elif isinstance(answer, Mapping):
        unknown = set(answer) - set(Step.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"the step answered unknown keys {sorted(unknown)}: use observation, role, name, done, reward"
            )
        step = Step(**answer)
    else:
        raise TypeError(f"a step returns a dict or rlrun.task.environment.Step, not {type(answer).__name__}")
    if step.role not in ROLES:
        raise ValueError(f"the step's role is {step.role!r}: one of {ROLES}")
    if not step.done and not isinstance(step.observation, str):
        raise ValueError("a step that is not done answers an observation (text)")
    if step.reward is not None:
        if isinstance(step.reward, bool) or not isinstance(step.reward, (int, float)) or not math.isfinite(step.reward):
            raise ValueError(f"the step's reward must be a finite number, got {step.reward!r}")
    return step


class ServedStep:
    """A step served over HTTP by a verifier of the researcher's (`environment.step=http://...`):
    each step is a POST of {"messages", "row", "info"} as JSON, answered with a step's fields as
    JSON. `$RLRUN_ENVIRONMENT_TOKEN`, when set, goes with every request as a bearer token."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, messages: list[dict], row: dict, info: TurnInfo) -> dict:
        import os

        import httpx

        token = os.environ.get("RLRUN_ENVIRONMENT_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = {"messages": messages, "row": row, "info": asdict(info)}
        response = httpx.post(self.url, json=body, headers=headers, timeout=None)  # the pool's timeout bounds it
        if response.status_code != 200:
            raise RuntimeError(f"{self.url} answered {response.status_code}: {response.text[:300]}")
        return response.json()


def load_step(ref: str) -> Callable:
    """The step function `ref` names, imported, or the verifier serving it at an http(s):// URL;
    TaskInputError saying why it cannot be."""
    from rlrun.task.rewards import load_attribute

    if ref.startswith(("http://", "https://")):
        return ServedStep(ref)
    function = load_attribute(ref, "environment.step")
    if not callable(function):
        where, name = ref.rsplit(":", 1)
        raise TaskInputError(f"environment.step {ref}: {where} has no function {name!r}.")
    try:
        inspect.signature(function).bind(None, None, None)
    except TypeError:
        raise TaskInputError(
            f"environment.step {ref}: a step takes (messages, row, info); see docs/your-task.md."
        ) from None
    except ValueError:
        pass  # a builtin without a readable signature: its first call will tell
    return function


def rerun_interrupted(function: Callable) -> bool:
    """May a step cut by a crash be run again? The function says so (default: yes)."""
    return bool(getattr(function, "rerun_interrupted", True))


def load_tools(ref: Optional[str]) -> list[dict]:
    """`environment.tools`: `module:NAME` or `file.py:NAME`, a list of tool schemas
    (`{"type": "function", "function": {"name", "description", "parameters"}}`) given to the model."""
    if not ref:
        return []
    from rlrun.task.rewards import load_attribute

    tools = load_attribute(ref, "environment.tools")
    if callable(tools):
        tools = tools()
    if not isinstance(tools, (list, tuple)) or not all(_is_tool(t) for t in tools):
        raise TaskInputError(
            f"environment.tools: {ref} is not a list of tool schemas "
            '({"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}).'
        )
    return [dict(t) for t in tools]


def _is_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    return isinstance(function, Mapping) and isinstance(function.get("name"), str)
