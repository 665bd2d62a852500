"""A task = problems + a reward function, chosen by `dataset.name`."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from rlrun.config.schema import DatasetConfig
from rlrun.data.arithmetic import Problem, arithmetic_problems, exact_answer_reward
from rlrun.data.gsm8k import gsm8k_problems, math_verify_reward

Reward = Callable[[str, str], float]  # (completion text, reference answer) -> reward


@dataclass(frozen=True)
class Task:
    problems: list[Problem]
    reward: Reward


def load_task(dataset: DatasetConfig, seed: int) -> Task:
    if dataset.name == "arithmetic":
        return Task(arithmetic_problems(dataset.max_operand, dataset.num_problems, seed), exact_answer_reward)
    if dataset.name == "gsm8k":
        return Task(gsm8k_problems(dataset.hf_path, dataset.hf_config, dataset.split), math_verify_reward)
    raise ValueError(f"unknown dataset {dataset.name!r}")


def problem_index(cursor: int, num_problems: int, seed: int) -> int:
    """The `cursor`-th problem: a fresh seeded permutation per pass (bench/vs_trl.py feeds TRL the same)."""
    epoch, position = divmod(cursor, num_problems)
    order = list(range(num_problems))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[position]
