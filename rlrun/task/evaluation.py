"""Held-out evaluation, the rules: which policy versions are evaluated, and the figures of one
evaluation (mean reward, pass@1, unbiased pass@k, per source). Pure: the actor samples
(`rlrun/actor/evaluator.py`), the trainer records (`rlrun/trainer/eval_gate.py`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from rlrun.config.schema import EvalConfig


def is_due(version: int, eval_cfg: EvalConfig, last_version: int) -> bool:
    """Whether policy `version` is evaluated: a multiple of eval.every_steps up to the last version
    training makes (0 only with eval.at_start)."""
    every = eval_cfg.every_steps
    if every <= 0 or version < 0 or version > last_version or version % every:
        return False
    return version > 0 or eval_cfg.at_start


def due_versions(eval_cfg: EvalConfig, last_version: int) -> list[int]:
    return [v for v in range(0, last_version + 1) if is_due(v, eval_cfg, last_version)]


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which `correct` are right (Chen et al.
    2021): 1 - C(n - c, k) / C(n, k)."""
    if not 0 < k <= n or not 0 <= correct <= n:
        raise ValueError(f"pass@{k} needs 0 < k <= n and 0 <= correct <= n (n={n}, correct={correct})")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


@dataclass(frozen=True)
class PromptResult:
    """One eval prompt's samples: their rewards, and its source (None: the split has one)."""

    rewards: list[float]
    source: str | None = None


def summarize(results: Sequence[PromptResult], threshold: float) -> dict:
    """The figures of one evaluation over `results` (every prompt with the same number of samples
    k): reward_mean over every sample, pass@1 and pass@k averaged over prompts, a sample being
    correct when its reward is at least `threshold`; per source too when there are several."""
    if not results:
        raise ValueError("an evaluation needs at least one prompt")
    k = len(results[0].rewards)
    if k == 0 or any(len(r.rewards) != k for r in results):
        raise ValueError("every eval prompt needs the same number of samples (eval.samples_per_prompt)")
    figures = _figures(results, threshold, k)
    sources = sorted({r.source for r in results if r.source is not None})
    if len(sources) > 1:
        figures["per_source"] = {s: _figures([r for r in results if r.source == s], threshold, k) for s in sources}
    return figures


def _figures(results: Sequence[PromptResult], threshold: float, k: int) -> dict:
    correct = [sum(1 for reward in r.rewards if reward >= threshold) for r in results]
    return {
        "prompts": len(results),
        "k": k,
        "reward_mean": round(statistics.fmean(x for r in results for x in r.rewards), 6),
        "pass@1": round(statistics.fmean(pass_at_k(k, c, 1) for c in correct), 6),
        f"pass@{k}": round(statistics.fmean(pass_at_k(k, c, k) for c in correct), 6),
        "correct": correct,  # per prompt, in eval-row order: how many of its k samples were correct
    }
