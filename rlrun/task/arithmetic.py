"""The generated arithmetic task: sums "a+b=" answered by their decimal result, and its reward.
Knows nothing about tokens, models or torch: prompts and answers are plain text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from rlrun.errors import ConfigError


@dataclass(frozen=True)
class Problem:
    prompt: str  # what the model is given, e.g. "3+4="
    answer: str  # the exact text expected after the prompt, e.g. "7" (no end-of-sequence marker)
    scoring: Any = field(default=None, compare=False)  # what the task's scorer needs besides the answer (reasoning_gym: the library's entry)


def arithmetic_problems(max_operand: int, num_problems: int, seed: int) -> list[Problem]:
    """`num_problems` distinct sums with operands in 0..max_operand (all of them at most), in a
    seeded order: same arguments, same list."""
    if max_operand < 0:
        raise ConfigError(f"dataset.max_operand must be 0 or more, got {max_operand}.")
    if num_problems < 1:
        raise ConfigError(f"dataset.num_problems must be 1 or more, got {num_problems}.")
    total = (max_operand + 1) ** 2
    rng = random.Random(seed)
    # Sampling indices (not a materialised list of pairs) keeps large operand ranges cheap.
    indices = rng.sample(range(total), min(num_problems, total))
    problems = []
    for index in indices:
        a, b = divmod(index, max_operand + 1)
        problems.append(Problem(prompt=f"{a}+{b}=", answer=str(a + b)))
    return problems


def exact_answer_reward(completion: str, answer: str) -> float:
    """1.0 if the completion (decoded without special tokens) is exactly the answer, surrounding
    whitespace ignored, else 0.0; one cut off by the budget counts too if its text is the answer."""
    return 1.0 if completion.strip() == answer.strip() else 0.0
