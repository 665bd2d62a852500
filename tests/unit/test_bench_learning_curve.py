"""bench/learning_curve.py's report: the rise of the reward against its step-to-step noise, and the
split of a step, read from a run's files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import learning_curve  # noqa: E402 - bench/ is not a package


def write_run(run_dir: Path, rewards: list[float]) -> None:
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text(json.dumps({"time": 1000.0, "event": "run_started"}) + "\n")
    lines = []
    for step, reward in enumerate(rewards, start=1):
        record = {"step": step, "samples": 16 * step, "reward_mean": reward, "tokens": 160, "time": 1030.0 + 10 * step,
                  "step_time_s": 10.0, "wait_s": 2.0, "weights_s": 3.0, "vllm_paused_s": 1.0, "generating_ms": 5000 * step,
                  "ettr": 0.5, "logprob_diff_tokens": 100, "logprob_diff_mean": 0.01, "logprob_diff_max": 0.1}  # fmt: skip
        lines.append(json.dumps(record))
    lines.append(json.dumps({**json.loads(lines[2]), "reward_mean": 0.99}))  # step 3 taken again: the later record counts
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_rising_reward_is_told_apart_from_noise(tmp_path, capsys):
    write_run(tmp_path / "run", [0.3, 0.32, 0.28, 0.31] * 5 + [0.6, 0.62, 0.58, 0.61] * 5)
    learning_curve.report(tmp_path / "run", window=10)
    out = capsys.readouterr().out
    assert "first 10 steps 0.375" in out  # 0.99 replaced step 3's 0.28
    assert "last 10 steps 0.601" in out and "the reward rises by more than its noise" in out
    assert "whole 10.00 = waiting for groups 2.00 + training 5.00 + weight update 3.00" in out


def test_a_flat_reward_is_not_called_learning(tmp_path, capsys):
    write_run(tmp_path / "run", [0.3, 0.5] * 20)
    learning_curve.report(tmp_path / "run", window=10)
    assert "does NOT rise by more than its noise" in capsys.readouterr().out
