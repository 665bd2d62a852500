"""The generated arithmetic task: sums "a+b=" answered by their decimal result (scored by
`rlrun.task.scorers:exact_answer`). Knows nothing about tokens, models or torch: plain text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlrun.errors import ConfigError


@dataclass(frozen=True)
class Sum:
    prompt: str  # what the model is given, e.g. "3+4="
    answer: str  # the exact text expected after the prompt, e.g. "7" (no end-of-sequence marker)


def arithmetic_rows(max_operand: int, num_problems: int, seed: int) -> list[dict]:
    """The task's rows: {"prompt": "3+4=", "answer": "7"}."""
    return [{"prompt": s.prompt, "answer": s.answer} for s in arithmetic_problems(max_operand, num_problems, seed)]


def arithmetic_problems(max_operand: int, num_problems: int, seed: int) -> list[Sum]:
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
        problems.append(Sum(prompt=f"{a}+{b}=", answer=str(a + b)))
    return problems
