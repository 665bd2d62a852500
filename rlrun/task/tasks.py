"""A task = problems + a reward function, chosen by `dataset.name`."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from rlrun.config.schema import DatasetConfig
from rlrun.data.arithmetic import Problem, arithmetic_problems, exact_answer_reward
from rlrun.data.gsm8k import gsm8k_problems, math_verify_reward

Reward = Callable[[str, Problem], float]  # (completion text, the problem) -> reward in [0, 1]


@dataclass(frozen=True)
class Task:
    problems: list[Problem]
    reward: Reward


def load_task(dataset: DatasetConfig, seed: int) -> Task:
    if dataset.name == "arithmetic":
        problems = arithmetic_problems(dataset.max_operand, dataset.num_problems, seed)
        return Task(problems, lambda completion, problem: exact_answer_reward(completion, problem.answer))
    if dataset.name == "gsm8k":
        problems = gsm8k_problems(dataset.hf_path, dataset.hf_config, dataset.split)
        return Task(problems, lambda completion, problem: math_verify_reward(completion, problem.answer))
    if dataset.name == "reasoning_gym":
        from rlrun.data.reasoning_gym import reasoning_gym_task  # imports the library: only when chosen

        return Task(*reasoning_gym_task(dataset.task, dataset.task_args, dataset.num_problems, seed, dataset.answer_format))
    raise ValueError(f"unknown dataset {dataset.name!r}")


def problem_index(cursor: int, num_problems: int, seed: int) -> int:
    """The `cursor`-th problem: a fresh seeded permutation per pass (bench/vs_trl.py feeds TRL the same)."""
    epoch, position = divmod(cursor, num_problems)
    order = list(range(num_problems))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[position]
