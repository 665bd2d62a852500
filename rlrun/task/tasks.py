"""A task = the training problems, the held-out ones, and the rewards that score them.

Every dataset kind comes down to rows (dicts of columns): `files` reads the researcher's own,
`arithmetic`, `gsm8k` and `reasoning_gym` generate or load theirs; then one path makes each row a
`Problem` (its prompt from a column, a template or chat messages) and splits off the held-out rows.
The rewards are named, not called, here (`RewardSpec`): they run in worker processes
(`rlrun/task/pool.py`).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rlrun.config.schema import DatasetConfig, RewardConfig
from rlrun.task.rewards import RewardSpec, reward_specs
from rlrun.task.rows import Row, TaskInputError, read_rows

Messages = tuple[Mapping[str, Any], ...]
MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Problem:
    prompt: str | Messages  # the text given to the model, or a chat conversation (model.chat_template)
    row: Mapping[str, Any] = field(compare=False)  # every column of its row: what the rewards read
    source: str | None = None  # dataset.source_column's value: evaluation figures per source

    @property
    def answer(self) -> Any:
        return self.row.get("answer")


@dataclass(frozen=True)
class Task:
    problems: list[Problem]  # training, in the order the prompt cursor walks (problem_index)
    eval_problems: list[Problem]
    rewards: list[RewardSpec]


@dataclass(frozen=True)
class PromptRule:
    column: str = "prompt"
    template: str | None = None
    system_prompt: str | None = None
    source_column: str | None = None


def load_task(
    dataset: DatasetConfig, seed: int, reward: RewardConfig | None = None, *, scored_by_environment: bool = False
) -> Task:
    """The task `dataset` describes, its rewards from `reward` (None: the dataset's built-in);
    `scored_by_environment`: environment.step gives the rewards (the task needs none of its own)."""
    reward = reward or RewardConfig()
    rows, eval_rows, builtin = _rows(dataset, seed)
    if not eval_rows and dataset.eval_fraction > 0:
        rows, eval_rows = held_out(rows, dataset.eval_fraction, seed)
    rule = PromptRule(dataset.prompt_column, dataset.prompt_template, dataset.system_prompt, dataset.source_column)
    where = ", ".join(dataset.train_files) or f"dataset={dataset.name}"
    problems = [problem(row, rule, f"{where}, row {i + 1}") for i, row in enumerate(rows)]
    eval_where = ", ".join(dataset.eval_files) or f"the held-out rows of {where}"
    eval_problems = [problem(row, rule, f"{eval_where}, row {i + 1}") for i, row in enumerate(eval_rows)]
    if not problems:
        raise TaskInputError(
            f"{where}: no training rows are left (dataset.eval_fraction={dataset.eval_fraction} took them all)."
        )
    functions = [] if scored_by_environment else list(reward.functions) or builtin
    if not functions and not scored_by_environment:
        raise TaskInputError(
            f"dataset={dataset.name} has no built-in reward: name yours, e.g. reward.functions=[my_reward.py:score] "
            "(docs/your-task.md has the signature)."
        )
    return Task(problems, eval_problems, reward_specs(functions, list(reward.weights)))


def _rows(dataset: DatasetConfig, seed: int) -> tuple[list[Row], list[Row], list[str]]:
    """(training rows, held-out rows from their own source, the built-in reward functions)."""
    if dataset.name == "arithmetic":
        from rlrun.task.arithmetic import arithmetic_rows

        return arithmetic_rows(dataset.max_operand, dataset.num_problems, seed), [], ["rlrun.task.scorers:exact_answer"]
    if dataset.name == "guess":
        from rlrun.task.guess import guess_rows

        return guess_rows(dataset.max_operand, dataset.num_problems, seed), [], []  # scored by its environment
    if dataset.name == "gsm8k":
        from rlrun.task.gsm8k import gsm8k_rows

        return gsm8k_rows(dataset.hf_path, dataset.hf_config, dataset.split), [], ["rlrun.task.scorers:math_verify"]
    if dataset.name == "reasoning_gym":
        from rlrun.task.reasoning_gym import reasoning_gym_rows  # imports the library: only when chosen

        rows = reasoning_gym_rows(dataset.task, dataset.task_args, dataset.num_problems, seed, dataset.answer_format)
        return rows, [], ["rlrun.task.scorers:reasoning_gym"]
    if not dataset.train_files:
        raise TaskInputError("dataset=files needs dataset.train_files: e.g. dataset.train_files=[problems.jsonl].")
    rows = [row for spec in dataset.train_files for row in read_rows(spec, dataset.split)]
    eval_rows = [row for spec in dataset.eval_files for row in read_rows(spec, dataset.split)]
    if dataset.eval_split:
        files = [spec for spec in dataset.train_files if Path(spec).expanduser().is_file()]
        if files:  # a file has no splits: read_rows would give its training rows back as the eval rows
            raise TaskInputError(
                f"dataset.eval_split={dataset.eval_split} picks a split of a `datasets` folder or hub dataset, but {files[0]} "
                "is a file, which has none: give the held-out rows as dataset.eval_files, or hold out dataset.eval_fraction."
            )
        eval_rows += [row for spec in dataset.train_files for row in read_rows(spec, dataset.eval_split)]
    if (dataset.eval_files or dataset.eval_split) and not eval_rows:
        raise TaskInputError(f"the eval split ({', '.join(dataset.eval_files) or dataset.eval_split}) holds no rows.")
    return rows, eval_rows, []


def held_out(rows: list[Row], fraction: float, seed: int) -> tuple[list[Row], list[Row]]:
    """(training rows, held-out rows): round(fraction x rows) rows, at least 1, chosen by `seed`;
    both keep the file's order."""
    count = max(1, round(len(rows) * fraction))
    if count >= len(rows):
        raise TaskInputError(f"dataset.eval_fraction={fraction} of {len(rows)} rows leaves none to train on: lower it.")
    chosen = set(random.Random(seed).sample(range(len(rows)), count))
    return [r for i, r in enumerate(rows) if i not in chosen], [r for i, r in enumerate(rows) if i in chosen]


def problem(row: Row, rule: PromptRule, where: str) -> Problem:
    """The row as a problem; TaskInputError naming `where` and the column when it cannot be one."""
    if rule.template is not None:
        prompt: str | Messages = fill_template(rule.template, row, where)
    elif rule.column not in row:
        raise TaskInputError(
            f"{where}: no column {rule.column!r} for the prompt (it has {', '.join(map(str, row)) or 'none'}). "
            'Set dataset.prompt_column, or dataset.prompt_template="...{column}...".'
        )
    else:
        prompt = prompt_value(row[rule.column], rule.column, where)
    if rule.system_prompt:
        messages = prompt if isinstance(prompt, tuple) else ({"role": "user", "content": prompt},)
        if not any(m["role"] == "system" for m in messages):
            prompt = ({"role": "system", "content": rule.system_prompt}, *messages)
    source = None
    if rule.source_column is not None:
        if rule.source_column not in row:
            raise TaskInputError(f"{where}: no column {rule.source_column!r} (dataset.source_column).")
        source = str(row[rule.source_column])
    return Problem(prompt, row, source)


def prompt_value(value: Any, column: str, where: str) -> str | Messages:
    """A prompt cell: text, or a list of {role, content} messages."""
    if isinstance(value, str):
        if not value.strip():
            raise TaskInputError(f"{where}: column {column!r} is empty.")
        return value
    if isinstance(value, (list, tuple)) and value:
        messages = []
        for m in value:
            if not (isinstance(m, Mapping) and m.get("role") in MESSAGE_ROLES and isinstance(m.get("content"), str)):
                raise TaskInputError(
                    f"{where}: column {column!r} holds a list, but {m!r} is not a message {{role, content}}."
                )
            messages.append({"role": m["role"], "content": m["content"]})
        return tuple(messages)
    raise TaskInputError(
        f"{where}: column {column!r} holds {type(value).__name__} {value!r}, not text or chat messages."
    )


def fill_template(template: str, row: Row, where: str) -> str:
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise TaskInputError(
            f"dataset.prompt_template={template!r} is not a template ({exc}); braces meant literally are {{{{ }}}}."
        ) from None
    for name in fields:
        column = name.split(".")[0].split("[")[0]
        if not column or column.isdigit():
            raise TaskInputError(
                f"dataset.prompt_template={template!r}: every {{}} must name a column, e.g. {{question}}."
            )
        if column not in row:
            raise TaskInputError(
                f"{where}: dataset.prompt_template names column {column!r}, which the row lacks (it has {', '.join(map(str, row))})."
            )
    try:
        return template.format_map(row)
    except (KeyError, IndexError, AttributeError, ValueError) as exc:
        raise TaskInputError(f"{where}: dataset.prompt_template={template!r} cannot be filled ({exc}).") from None


def problem_index(cursor: int, num_problems: int, seed: int) -> int:
    """The `cursor`-th problem: a fresh seeded permutation per pass (bench/vs_trl.py feeds TRL the same)."""
    epoch, position = divmod(cursor, num_problems)
    order = list(range(num_problems))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[position]
