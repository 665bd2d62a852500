"""A task of the reasoning-gym library (`dataset=reasoning_gym dataset.task=<name>`): procedural
problems, scored by the library's own verifier (`rlrun.task.scorers:reasoning_gym`).

The library generates `num_problems` entries (question, answer, metadata) from `run.seed` and the
task's own config (`dataset.task_args`); each becomes a row (prompt, answer, the entry, the answer
format), and the scorer calls the library's `score_answer(answer, entry)`, which wants the final
answer alone. How it is found in a completion is `dataset.answer_format`:
`answer_tag` asks for it between <answer> and </answer> and takes it out with the library's
`extract_answer`, as its own training examples do; `last_number` takes the completion's last
number (a small model asked for "the number only" writes "12 + 7 = 19."). Knows nothing about
tokens or chat templates: the actor renders the prompt for the model.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from rlrun.errors import ConfigError, EnvironmentProblem

INSTRUCTIONS = {
    "answer_tag": "Give the final answer between <answer> and </answer>, e.g. <answer>42</answer>.",
    "last_number": "Answer with the number only.",
}
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def require_library():
    try:
        import reasoning_gym
    except ImportError:
        raise EnvironmentProblem(
            "dataset=reasoning_gym needs the reasoning-gym package: pip install 'rlrun[cpu]' (or pip install "
            "reasoning-gym), or ./scripts/setup-env."
        ) from None
    return reasoning_gym


def reasoning_gym_rows(
    task: str | None, task_args: Mapping[str, Any], num_problems: int, seed: int, answer_format: str
) -> list[dict]:
    """The rows of the library's task `task`: prompt, answer, entry (the library's), answer_format."""
    if not task:
        raise ConfigError(
            "dataset=reasoning_gym needs dataset.task: the library's dataset name, e.g. dataset.task=chain_sum."
        )
    if num_problems < 1:
        raise ConfigError(f"dataset.num_problems must be 1 or more, got {num_problems}.")
    if answer_format not in INSTRUCTIONS:
        raise ConfigError(f"dataset.answer_format={answer_format}: choose one of {', '.join(INSTRUCTIONS)}.")
    library = require_library()
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise ConfigError(
            f"dataset.task={task} is not a reasoning-gym task; some it has: {', '.join(sorted(DATASETS)[:40])}, ..."
        )
    try:
        dataset = library.create_dataset(task, seed=seed, size=num_problems, **dict(task_args))
        entries = [dataset[i] for i in range(num_problems)]
    except (TypeError, ValueError, AssertionError) as exc:  # the task's config refused an argument
        raise ConfigError(
            f"dataset.task_args={dict(task_args)} do not fit reasoning-gym's {task}: {exc}. A recipe's task_args are "
            f"merged with yours: start from none with ~dataset.task_args (then +dataset.task_args.KEY=VALUE)."
        ) from None
    instruction = INSTRUCTIONS[answer_format]
    return [
        {
            "prompt": f"{entry['question'].rstrip()}\n{instruction}",
            "answer": str(entry["answer"]),
            "entry": entry,
            "answer_format": answer_format,
        }
        for entry in entries
    ]


def score(completion: str, entry: Mapping[str, Any], answer_format: str) -> float:
    """The library's verifier on the answer found in `completion`; 0 for one it chokes on."""
    from reasoning_gym.factory import get_score_answer_fn

    try:
        return float(
            get_score_answer_fn(entry["metadata"]["source_dataset"])(extractor(answer_format)(completion), entry)
        )
    except Exception:  # noqa: BLE001 - a scorer that chokes on a malformed answer: that answer is wrong
        return 0.0


def extractor(answer_format: str) -> Callable[[str], str | None]:
    """The answer in a completion, as the task's scorer wants it (None: there is none)."""
    if answer_format == "answer_tag":
        from reasoning_gym.utils import extract_answer

        return extract_answer
    return last_number


def last_number(completion: str) -> str | None:
    """The last number written in `completion` ("12 + 7 = 19." -> "19"; "1,000" -> "1000")."""
    found = NUMBER.findall(completion)
    return found[-1].replace(",", "") if found else None
