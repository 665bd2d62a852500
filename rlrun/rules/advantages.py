"""Group-relative advantages: one group's rewards → one advantage per sample. Pure Python; the
actor computes them at delivery, and it lives outside both roles' packages so neither imports the other.
"""

from __future__ import annotations

import math


def group_advantages(rewards: list[float], normalize_std: bool, eps: float = 1e-6) -> list[float]:
    """Per-sample advantages, in group order: reward minus the group mean, with `normalize_std`
    divided by `std + eps` (population std); all zeros when every reward is equal (no signal)."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if all(r == rewards[0] for r in rewards):
        return [0.0] * n
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / n)
    if std + eps == 0.0:  # spread below float resolution (subnormal rewards): no signal either
        return [0.0] * n
    return [c / (std + eps) for c in centred]
