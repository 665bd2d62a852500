"""bench/vs_trl.py's figures: smoothed reward, time to a threshold, reward at equal wall time, the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import vs_trl  # noqa: E402

P = vs_trl.Point


def points(rewards: list[float], every_s: float = 2.0, start_s: float = 40.0, per_step: int = 256) -> list:
    return [P(start_s + every_s * i, i + 1, per_step * (i + 1), r) for i, r in enumerate(rewards)]


def test_smoothing_uses_full_windows_only_so_one_lucky_step_does_not_count():
    pts = points([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    curve = vs_trl.smoothed(pts, 3)
    assert [round(r, 3) for _, r in curve] == [0.333, 0.0, 0.333, 0.667, 1.0]
    assert curve[0][0] == pts[2].seconds  # the first full window ends at the third step
    assert vs_trl.time_to(curve, 0.9) == pts[6].seconds
    assert vs_trl.time_to(curve, 0.5) == pts[5].seconds  # not step 1, whose reward alone was 1.0
    assert vs_trl.time_to(curve, 1.01) is None


def test_reward_at_equal_wall_time_is_the_last_value_known_then():
    curve = [(10.0, 0.2), (20.0, 0.5), (30.0, 0.9)]
    assert vs_trl.reward_at(curve, 25.0) == 0.5
    assert vs_trl.reward_at(curve, 30.0) == 0.9
    assert vs_trl.reward_at(curve, 5.0) is None


def test_samples_per_second_counts_training_time_not_startup():
    pts = points([0.5] * 11, every_s=2.0, start_s=40.0)  # steps end at 40..60 s
    assert vs_trl.samples_per_s(pts, first_step_s=38.0) == pytest.approx(11 * 256 / 22.0)
    assert vs_trl.samples_per_s([], 0.0) is None


def test_the_table_compares_each_system_with_trl_of_the_same_algorithm():
    fast = points([0.2] * 5 + [0.85] * 20, every_s=1.0, start_s=30.0)
    slow = points([0.2] * 5 + [0.85] * 20, every_s=4.0, start_s=10.0)
    results = [
        {"name": "trl-gspo", "recipe": "math_gspo", "first_step_s": 9.0, "points": slow, "load": "1/1/1 -> 1/1/1"},
        {"name": "rlrun-gspo", "recipe": "math_gspo", "first_step_s": 29.0, "points": fast, "load": "1/1/1 -> 1/1/1"},
    ]
    text = vs_trl.report(results, window=3)
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in text.splitlines() if "|" in line}
    # the window of 3 first holds three 0.85 at step 8: rlrun at 30 + 7 = 37 s, TRL at 10 + 28 = 38 s
    assert rows["rlrun-gspo"][4] == "37" and rows["trl-gspo"][4] == "38"
    assert rows["rlrun-gspo"][10] == f"{38 / 37:.2f}"  # x TRL to 0.8
    assert rows["trl-gspo"][10] == "1.00"
    assert "goal gspo: rlrun reaches 0.8 in at most half of TRL's time: NOT met" in text


def test_steps_after_the_budget_do_not_count():
    pts = points([0.5] * 5, every_s=10.0, start_s=250.0)  # 250, 260, ..., 290 s
    assert [p.step for p in vs_trl.within(pts, 270.0)] == [1, 2, 3]
