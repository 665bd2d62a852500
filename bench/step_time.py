"""Trainer step time of a finished (or running) run, from its metrics.jsonl.

    python bench/step_time.py RUN_DIR

Prints seconds per optimizer step (median, mean, p90 of `step_time_s`, step 1 left out: it
includes start-up and waiting for the first groups), steps per minute from the `time` field
(wall clock from step 1's record to the last one), and the mean reward of the first and last
10 steps. Reads only; prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def read_metrics(path: Path) -> list[dict]:
    """The step records, by step (records of another `kind`, an evaluation's, left out)."""
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            records.append(json.loads(line))
    return sorted((r for r in records if r.get("kind", "step") == "step"), key=lambda r: r["step"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--window", type=int, default=10, help="steps averaged for first/last reward (default 10)")
    args = parser.parse_args(argv)
    path = args.run_dir / "metrics.jsonl"
    if not path.is_file():
        print(f"{path} does not exist: give a run directory with a metrics.jsonl", file=sys.stderr)
        return 2
    records = read_metrics(path)
    if len(records) < 2:
        print(f"{path} has {len(records)} step(s): need at least 2", file=sys.stderr)
        return 2
    times = [r["step_time_s"] for r in records if r["step"] != 1]
    first, last = records[0], records[-1]
    span_s = last["time"] - first["time"]
    steps_per_min = (last["step"] - first["step"]) / span_s * 60 if span_s > 0 else float("nan")
    w = args.window
    reward_first = statistics.fmean(r["reward_mean"] for r in records[:w])
    reward_last = statistics.fmean(r["reward_mean"] for r in records[-w:])
    print(f"run: {args.run_dir}  steps {first['step']}..{last['step']} ({len(records)} records)")
    print(f"step 1 step_time_s (start-up, excluded): {first['step_time_s']:.2f}" if first["step"] == 1 else "step 1 not in the file")
    print(f"seconds per step (steps 2..{last['step']}): median {statistics.median(times):.3f}, mean {statistics.fmean(times):.3f}, p90 {percentile(times, 90):.3f}")
    print(f"steps/minute from `time` (step {first['step']} -> {last['step']}, {span_s:.1f} s): {steps_per_min:.1f}")
    print(f"reward_mean: first {min(w, len(records))} steps {reward_first:.4f}, last {min(w, len(records))} steps {reward_last:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
