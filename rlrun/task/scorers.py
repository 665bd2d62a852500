"""The built-in rewards, functions of the same kind as a researcher's own (docs/your-task.md):
`f(completion, row, info) -> float`. The dataset kinds name them as their default reward."""

from __future__ import annotations

from typing import Any, Mapping

from rlrun.task.rewards import SampleInfo


def exact_answer(completion: str, row: Mapping[str, Any], info: SampleInfo | None = None) -> float:
    """1.0 if the completion (decoded without special tokens) is exactly the row's `answer`,
    surrounding whitespace ignored, else 0.0; one cut off by the budget counts too if its text is the answer."""
    return 1.0 if completion.strip() == str(row["answer"]).strip() else 0.0


def math_verify(completion: str, row: Mapping[str, Any], info: SampleInfo | None = None) -> float:
    """math-verify's equivalence of the completion's final answer and the row's `answer`."""
    from math_verify import parse, verify

    gold, predicted = parse(str(row["answer"])), parse(completion)
    return 1.0 if gold and predicted and verify(gold, predicted) else 0.0


def reasoning_gym(completion: str, row: Mapping[str, Any], info: SampleInfo | None = None) -> float:
    """reasoning-gym's own verifier on the row's `entry`, the answer found by its `answer_format`."""
    from rlrun.task.reasoning_gym import score

    return score(completion, row["entry"], row.get("answer_format", "answer_tag"))


def length_penalty(completion: str, row: Mapping[str, Any], info: SampleInfo) -> float:
    """-1.0 for a completion cut off by the token budget (finish reason `length`), else 0.0: weigh it
    beside a correctness reward to discourage rambling, e.g. reward.weights=[1.0, 0.2]."""
    return -1.0 if info.finish_reason == "length" else 0.0
