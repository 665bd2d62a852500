"""bench/vs_trl.py's figures: smoothed reward, time to a threshold, reward at equal wall time, the table."""

from __future__ import annotations

import json
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
    assert rows["rlrun-gspo"][5] == "37" and rows["trl-gspo"][5] == "38"
    assert rows["rlrun-gspo"][10] == "54" and rows["trl-gspo"][10] == "106"  # the last step: 30 + 24, 10 + 96
    assert rows["rlrun-gspo"][11] == f"{37 / 38:.2f}"  # to 0.8 / TRL
    assert rows["trl-gspo"][11] == "1.00"
    assert "goal rlrun-gspo: reaches 0.8 no later than trl-gspo (ratio <= 1.0): met (37 s vs 38 s, ratio 0.97)" in text


def test_rounds_are_reported_as_their_median_and_spread_and_async_is_judged_against_sync():
    def run(name, every_s, round_):
        return {"name": name, "round": round_, "recipe": "math_gspo", "first_step_s": 9.0,
                "points": points([0.2] * 5 + [0.85] * 20, every_s=every_s, start_s=10.0), "load": "1/1/1 -> 1/1/1"}

    results = [run("rlrun-gspo", 1.0, 1), run("rlrun-gspo-sync", 2.0, 1), run("rlrun-gspo", 3.0, 2), run("rlrun-gspo-sync", 2.0, 2),
               run("rlrun-gspo", 2.0, 3), run("rlrun-gspo-sync", 2.0, 3)]  # fmt: skip
    text = vs_trl.report(results, window=3)
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")] for line in text.splitlines() if "|" in line}
    # time to 0.8 = 10 + 7 * every_s: 17, 31, 24 s over three rounds
    assert rows["rlrun-gspo"][1] == "3" and rows["rlrun-gspo"][5] == "24 (17-31)"
    assert rows["rlrun-gspo-sync"][5] == "24 (24-24)"
    assert "goal rlrun-gspo: asynchrony worth >= 1.3x over rlrun-gspo-sync (time to 0.8): NOT met (1.00x" in text


def test_the_split_of_a_step_comes_from_the_runs_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(vs_trl, "mean_prompt_tokens", lambda recipe: 5.0)
    rows = []
    for step in range(1, 12):  # 10 steps after the first: 16 groups each, 2 samples continued from the journal (3 tokens each), 1 on a retry (4)
        rows.append({"step": step, "samples": 256 * step, "reward_mean": 0.5, "time": 100.0 + step, "step_time_s": 0.4,
                     "wait_s": 0.05, "weights_s": 0.1, "vllm_paused_s": 0.02 + 0.001 * step, "groups_published": 16 * step,
                     "requests": 18 * step, "samples_continued": 2 * step, "tokens_reused": 6 * step,
                     "samples_continued_on_retry": step, "tokens_kept_on_retry": 4 * step,
                     "generating_ms": 300 * step, "samples_spanning_update": 3, "ettr": 0.6})  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = vs_trl.step_split(tmp_path, "math_gspo")
    assert split["step_s"] == 0.4 and split["train_s"] == pytest.approx(0.25) and split["generating_s"] == pytest.approx(0.3)
    assert split["requests_per_group"] == pytest.approx(18 / 16) and split["prefilled_again_per_step"] == pytest.approx(6 + 4 + (2 + 1) * 5)
    assert split["paused_s"] == pytest.approx(0.0265) and split["paused_p90_s"] == pytest.approx(0.0301)
    assert split["spanning_per_step"] == 3 and split["ettr"] == 0.6


def test_steps_after_the_budget_do_not_count():
    pts = points([0.5] * 5, every_s=10.0, start_s=250.0)  # 250, 260, ..., 290 s
    assert [p.step for p in vs_trl.within(pts, 270.0)] == [1, 2, 3]


def test_a_real_model_system_is_compared_with_trl_on_its_recipe_and_trl_steps_are_split(tmp_path):
    fast = points([0.2] * 5 + [0.85] * 20, every_s=1.0, start_s=30.0)
    slow = points([0.2] * 5 + [0.85] * 20, every_s=4.0, start_s=10.0)
    results = [
        {"name": "trl-smollm2", "recipe": "smollm2_grpo", "first_step_s": 9.0, "points": slow, "load": "-"},
        {"name": "trl-grpo", "recipe": "math_grpo", "first_step_s": 9.0, "points": fast, "load": "-"},
        {"name": "rlrun-smollm2-fast", "recipe": "smollm2_grpo", "first_step_s": 29.0, "points": fast, "load": "-"},
    ]
    text = vs_trl.report(results, window=3)
    assert "goal rlrun-smollm2-fast: reaches 0.8 no later than trl-smollm2 (ratio <= 1.0): met (37 s vs 38 s" in text
    steps = tmp_path / "steps.jsonl"
    rows = [{"kind": "train_begin", "seconds": 5.0}] + [
        {"kind": "step", "step": i, "seconds": 10.0 + 6.0 * i, "generating_s": 2.0 + (i == 1) * 9} for i in range(1, 6)
    ]
    steps.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert vs_trl.trl_split(steps) == {"step_s": 6.0, "generating_s": 2.0, "train_s": 4.0}  # step 1 left out
