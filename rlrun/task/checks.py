"""The task's own preflight: its files read, its prompts built, every reward imported and called on
the first row, the eval split there when evaluation is asked for. Each failure is a TaskInputError
(exit 2) naming the file, row, column or function, raised before the run creates anything."""

from __future__ import annotations

import threading
from typing import Any

from rlrun.config.schema import DatasetConfig, EnvironmentConfig, EvalConfig, RewardConfig
from rlrun.task.environment import load_step, load_tools
from rlrun.task.rewards import GroupCall, SampleInfo, call_reward, load_function
from rlrun.task.rows import TaskInputError
from rlrun.task.tasks import Task, load_task


def check_task(
    dataset: DatasetConfig,
    reward: RewardConfig,
    eval_cfg: EvalConfig,
    *,
    seed: int,
    chat_template: bool,
    scored_by_environment: bool = False,
) -> Task:
    task = load_task(dataset, seed, reward, scored_by_environment=scored_by_environment)
    if not chat_template:
        for what, problems in (("the training rows", task.problems), ("the eval rows", task.eval_problems)):
            if problems and any(isinstance(p.prompt, tuple) for p in problems):
                why = "dataset.system_prompt is set" if dataset.system_prompt else "they hold chat messages"
                raise TaskInputError(
                    f"{what} are conversations ({why}), which need the model's chat template: set model.chat_template=true, "
                    "or give plain text prompts."
                )
    if eval_cfg.temperature == 0 and eval_cfg.samples_per_prompt > 1:
        raise TaskInputError(
            f"eval.samples_per_prompt={eval_cfg.samples_per_prompt} with eval.temperature=0: greedy samples of a prompt are all "
            "the same (and vLLM refuses n > 1 when greedy). Set eval.samples_per_prompt=1, or eval.temperature above 0 for pass@k."
        )
    if eval_cfg.every_steps and not task.eval_problems:
        raise TaskInputError(
            "eval.every_steps is set but there is nothing to evaluate: give dataset.eval_files, dataset.eval_split or "
            "dataset.eval_fraction (a held-out share of the rows), or set eval.every_steps=0."
        )
    first = task.problems[0]
    for spec in task.rewards:
        function = load_function(spec.ref)
        completion = str(first.row.get("answer", "")) if isinstance(first.row.get("answer"), (str, int, float)) else ""
        call = GroupCall(
            first.prompt, first.row, [completion], [[]], [SampleInfo("stop", 0)], isinstance(first.prompt, tuple)
        )
        outcome = _within(lambda: call_reward(function, call), reward.timeout_s)
        if isinstance(outcome, TimeoutError):
            raise TaskInputError(
                f"reward {spec.ref} did not answer within reward.timeout_s={reward.timeout_s:g} s on the first training row: "
                "make it faster or raise reward.timeout_s."
            )
        if isinstance(outcome, BaseException):
            raise TaskInputError(
                f"reward {spec.ref} failed on the first training row ({_frames(outcome)}). Fix the function (or the row)."
            )
    return task


def check_environment(environment: EnvironmentConfig) -> None:
    """The step function imports and takes (messages, row, info); the tools are tool schemas."""
    if environment.step:
        load_step(environment.step)
    load_tools(environment.tools)


def _within(action, timeout_s: float) -> Any:
    """`action()`'s result or exception; a TimeoutError when it has not returned in `timeout_s`
    (it goes on in a daemon thread: the command exits with the error)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(action())
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="reward-preflight")
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else TimeoutError()


def _frames(exc: BaseException) -> str:
    """The exception and the last frames of its traceback, on one line."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc}" + (f"; at {where}" if where else "")
