"""Rewards as code: which functions, how each is called, what a call's answer must be.

A reward is named `module:function` or `path/to/file.py:function` and called in one of two ways,
told apart by its parameters:

- rlrun's: `f(completion, row, info) -> float | dict[str, float]`, once per sample: the completion's
  text, its row (every column), and `info` (`SampleInfo`: finish reason, token count, sample index,
  policy version). Two parameters (`completion, row`) are fine too. A dict's values are summed.
- TRL's (`GRPOTrainer`'s `reward_funcs`): a parameter named `completions` means
  `f(prompts, completions, completion_ids, **columns) -> list[float | None]`, once per group, each
  column as a list; None scores nothing for that sample, as in TRL.

Plain or `async def`. Nothing here runs a call off the event loop: `rlrun/task/pool.py` does, in
worker processes that call `call_reward`.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

from rlrun.task.rows import TaskInputError


@dataclass(frozen=True)
class RewardSpec:
    ref: str  # module:function or path/to/file.py:function
    weight: float = 1.0

    @property
    def name(self) -> str:
        """What metrics and logs call it: the function's name."""
        return self.ref.rsplit(":", 1)[-1]


@dataclass(frozen=True)
class SampleInfo:
    """What the actor knows of a sample besides its text and row."""

    finish_reason: str  # "stop" (end of sequence) or "length" (budget spent)
    num_tokens: int  # completion tokens
    index: int = 0  # its position in the group
    policy_version: int = 0  # the newest weights that sampled it


@dataclass(frozen=True)
class GroupCall:
    """One group's completions to score: what every reward of it is called with."""

    prompt: Any  # the problem's prompt: text or chat messages
    row: Mapping[str, Any]
    texts: list[str]
    completion_ids: list[list[int]]
    infos: list[SampleInfo]
    conversational: bool = False  # TRL-style calls get messages, not text


def reward_specs(functions: Sequence[str], weights: Sequence[float]) -> list[RewardSpec]:
    if weights and len(weights) != len(functions):
        raise TaskInputError(
            f"reward.weights has {len(weights)} values for {len(functions)} reward.functions: give one per function, or none (all 1)."
        )
    for ref in functions:
        if ":" not in ref or not ref.rsplit(":", 1)[1].isidentifier():
            raise TaskInputError(f"reward.functions: {ref!r} is not module:function or path/to/file.py:function.")
    return [RewardSpec(ref, float(w)) for ref, w in zip(functions, weights or [1.0] * len(functions))]


def load_function(ref: str) -> Callable:
    """The reward function `ref` names, imported; TaskInputError saying why it cannot be."""
    function = load_attribute(ref, "reward")
    if not callable(function):
        where, name = ref.rsplit(":", 1)
        raise TaskInputError(f"reward {ref}: {where} has no function {name!r}.")
    convention(function, ref)  # refuses a signature it cannot call
    return function


def load_attribute(ref: str, what: str) -> Any:
    """What `module:NAME` or `path/to/file.py:NAME` names, imported (None when the module has no
    NAME); TaskInputError saying why the module cannot be imported. `what` names the setting."""
    where, name = ref.rsplit(":", 1)
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise TaskInputError(f"{what} {ref}: no file {path}.")
        module_name = f"rlrun_reward_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise TaskInputError(f"{what} {ref}: {path} cannot be imported as a Python module.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up here
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - whatever the user's module raised at import
            raise TaskInputError(f"{what} {ref}: importing {path} raised {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # noqa: BLE001
            raise TaskInputError(
                f"{what} {ref}: cannot import module {where!r} ({type(exc).__name__}: {exc})."
            ) from None
    return getattr(module, name, None)


def convention(function: Callable, ref: str) -> str:
    """ "trl" (a parameter named completions) or "rlrun"; TaskInputError for a signature neither fits."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        raise TaskInputError(f"reward {ref}: its signature cannot be read.") from None
    if "completions" in parameters:
        return "trl"
    positional = [p for p in parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in parameters.values())
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 3 or (len(positional) < 2 and not varargs):
        raise TaskInputError(
            f"reward {ref}: takes ({', '.join(parameters)}); a reward takes (completion, row, info) or (completion, row), "
            "or TRL's (prompts, completions, **kwargs). docs/your-task.md has both."
        )
    return "rlrun"


def call_reward(function: Callable, call: GroupCall) -> list[float | None]:
    """The function's reward for every sample of `call` (None: it scored nothing for that one);
    raises what the function raised, or a ValueError for an answer that is not a reward."""
    if convention(function, getattr(function, "__name__", "?")) == "trl":
        values = _run(function, **_trl_arguments(function, call))
        if not isinstance(values, (list, tuple)) or len(values) != len(call.texts):
            raise ValueError(f"returned {_shown(values)}, not a list of {len(call.texts)} rewards (one per completion)")
        return [None if v is None else _number(v) for v in values]
    takes_info = len(inspect.signature(function).parameters) >= 3
    return [
        _number(_run(function, text, call.row, info) if takes_info else _run(function, text, call.row))
        for text, info in zip(call.texts, call.infos)
    ]


def _trl_arguments(function: Callable, call: GroupCall) -> dict[str, Any]:
    n = len(call.texts)
    if call.conversational:
        prompts: list[Any] = [
            list(call.prompt) if isinstance(call.prompt, tuple) else [{"role": "user", "content": call.prompt}]
        ] * n
        completions: list[Any] = [[{"role": "assistant", "content": text}] for text in call.texts]
    else:
        prompts, completions = [call.prompt] * n, list(call.texts)
    version = max((i.policy_version for i in call.infos), default=0)
    arguments = {
        "prompts": prompts,
        "completions": completions,
        "completion_ids": call.completion_ids,
        **{column: [value] * n for column, value in call.row.items() if column not in ("prompt", "completion")},
        "trainer_state": SimpleNamespace(global_step=version),
        "log_extra": lambda *a, **k: None,  # TRL's completion-table and metric hooks: not recorded here
        "log_metric": lambda *a, **k: None,
    }
    parameters = inspect.signature(function).parameters
    if any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        return arguments
    return {k: v for k, v in arguments.items() if k in parameters}


def _run(function: Callable, *args, **kwargs) -> Any:
    result = function(*args, **kwargs)
    # asyncio.run refuses an awaitable that is not a coroutine itself, saying so
    return asyncio.run(result) if inspect.isawaitable(result) else result  # type: ignore[arg-type]


def _number(value: Any) -> float:
    import numbers

    if isinstance(value, Mapping):  # named components: their sum is the reward
        return sum(_number(v) for v in value.values())
    if not isinstance(value, numbers.Real):  # int, float, bool, numpy's and torch's scalars
        raise ValueError(f"returned {_shown(value)}, not a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"returned {value}, not a finite number")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


def reward_in_process(specs: Sequence[RewardSpec]) -> Callable[[str, Any, Mapping[str, Any]], float]:
    """(completion text, prompt, row) -> the weighted sum of `specs`, called here, in this process:
    for benchmarks and checks that score a few samples, never for the actor (its pool is `pool.py`)."""
    functions = [(load_function(s.ref), s.weight) for s in specs]

    def reward(text: str, prompt: Any, row: Mapping[str, Any]) -> float:
        call = GroupCall(prompt, row, [text], [[]], [SampleInfo("stop", 0)], isinstance(prompt, tuple))
        return sum(weight * (call_reward(function, call)[0] or 0.0) for function, weight in functions)

    return reward
