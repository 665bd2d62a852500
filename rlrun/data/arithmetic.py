"""The generated arithmetic task: sums "a+b=" answered by their decimal result, and its reward.

Owns the problem set (which pairs, in which order, for a given seed) and the exact-answer reward.
Knows nothing about tokens, models or torch: prompts and answers are plain text, and the caller
decides how they are tokenized and how the end-of-sequence token is removed from a completion.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlrun.errors import ConfigError


@dataclass(frozen=True)
class Problem:
    prompt: str  # what the model is given, e.g. "3+4="
    answer: str  # the exact text expected after the prompt, e.g. "7" (no end-of-sequence marker)


def arithmetic_problems(max_operand: int, num_problems: int, seed: int) -> list[Problem]:
    """Return `num_problems` distinct sums with operands in 0..max_operand, in a seeded order.

    All (max_operand + 1) ** 2 pairs when `num_problems` is at least that many (shuffled by the
    seed), else a seeded sample of pairs without repetition. Same arguments, same list.
    """
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
    """1.0 if the completion is exactly the answer (surrounding whitespace ignored), else 0.0.

    `completion` is the text generated after the prompt, up to (not including) the first
    end-of-sequence token: vLLM and the tokenizer's decode with skip_special_tokens give that.
    A completion cut off by the token budget before its end-of-sequence still counts if its text
    is exactly the answer; the actor decides whether truncated samples may earn reward.
    """
    return 1.0 if completion.strip() == answer.strip() else 0.0
