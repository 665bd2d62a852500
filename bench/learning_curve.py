"""Does a recipe learn, and what does it cost: one `rlrun train`, its reward curve and time split.

    python bench/learning_curve.py [--run RUN_DIR] [--window 10] [hydra overrides...]

Default: `rlrun train recipe=smollm2_grpo` (the real model on 2 cores, ~20 minutes) in a temporary
run directory, kept afterwards (its plot.png is the curve over steps and wall-clock seconds). While
it runs, the RSS of its whole process tree and the machine's used memory are sampled every second.
With --run, a finished run is read instead (nothing is started).

Prints, from metrics.jsonl:
  - the reward: mean of the first and of the last `--window` steps, the rise, and the step-to-step
    noise (standard deviation of the per-step mean reward over the last window): the recipe
    learns when the rise is larger than that noise; the curve, smoothed over `--window` steps,
    every tenth of the run, with the wall-clock seconds of each point (and the model turns per
    sample, for a recipe of several turns);
  - time per step (medians, step 1 left out: it includes start-up): the whole step, waiting for
    the actor's groups (generation the trainer could not overlap), training (forward, backward,
    optimizer), the weight update (saving or broadcasting the weights and vLLM loading them), and
    vLLM's paused time per update; the actor's generating time over the whole run;
  - wall time of the run and of its start-up (Redis, vLLM, the model build), and peak memory.
It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ["recipe=smollm2_grpo"]


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_steps(records: list[dict]) -> list[dict]:
    """One step record per step (records of another `kind`, an evaluation's, left out), by step."""
    steps = [r for r in records if r.get("kind", "step") == "step"]
    by_step = {r["step"]: r for r in steps}  # a step taken again after a restart: the later record
    return [by_step[s] for s in sorted(by_step)]


class MemorySampler:
    """Peak RSS of a process tree (shared pages counted once per process) and of the machine."""

    def __init__(self, pid: int) -> None:
        self.root, self.tree_peak, self.used_peak = psutil.Process(pid), 0, 0
        self.used_before = psutil.virtual_memory().used
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.tree_peak = max(self.tree_peak, total)
            self.used_peak = max(self.used_peak, psutil.virtual_memory().used)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run(run_dir: Path, overrides: list[str]) -> tuple[int, float, MemorySampler]:
    argv = [sys.executable, "-m", "rlrun", "train", f"run.dir={run_dir}", "supervisor.live_view=false", *overrides]
    started = time.time()
    with open(run_dir.parent / "rlrun.out", "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    memory = MemorySampler(proc.pid)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGINT)  # rlrun stops its processes in order
        code = proc.wait()
    memory.stop()
    return code, time.time() - started, memory


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(run_dir: Path, window: int) -> None:
    records = final_steps(read_jsonl(run_dir / "metrics.jsonl"))
    if len(records) < 2:
        print(f"{run_dir}: {len(records)} step record(s), nothing to report")
        return
    events = read_jsonl(run_dir / "events.jsonl")
    t0 = next((e["time"] for e in events if e.get("event") == "run_started"), records[0]["time"])
    rewards = [r["reward_mean"] for r in records]
    w = min(window, len(records) // 2)
    first, last = statistics.fmean(rewards[:w]), statistics.fmean(rewards[-w:])
    noise = statistics.pstdev(rewards[-w:])
    verdict = "rises by more than" if last - first > noise else "does NOT rise by more than"
    print(f"steps {len(records)}; reward: first {w} steps {first:.3f}, last {w} steps {last:.3f}, rise {last - first:+.3f}; "
          f"step-to-step noise (std of the last {w} steps' means) {noise:.3f}: the reward {verdict} its noise")  # fmt: skip
    per_step = records[0]["samples"]  # samples of step 1: every step takes as many
    print("reward curve (mean over the window ending at the step):")
    marks = sorted({max(w, round(k * len(records) / 10)) for k in range(1, 11)})
    for end in marks:
        part = records[end - w : end]
        turns = [r["turns_mean"] for r in part if "turns_mean" in r]  # conversations (environment.step): model turns
        print(f"    step {part[-1]['step']:>4}  t={part[-1]['time'] - t0:7.0f} s  reward {statistics.fmean(r['reward_mean'] for r in part):.3f}  "
              f"completion tokens/sample {statistics.fmean(r['tokens'] for r in part) / per_step:5.1f}"
              + (f"  turns/sample {statistics.fmean(turns):.2f}" if turns and max(turns) > 1 else ""))  # fmt: skip
    later = [r for r in records if r["step"] != 1]
    step = [r["step_time_s"] for r in later]
    wait = [r["wait_s"] for r in later]
    weights = [r["weights_s"] for r in later]
    train = [r["step_time_s"] - r["wait_s"] - r["weights_s"] for r in later]
    paused = [r["vllm_paused_s"] for r in later if r.get("vllm_paused_s") is not None]
    print(f"time per step, median s (step 1 left out): whole {median(step):.2f} = waiting for groups {median(wait):.2f} + "
          f"training {median(train):.2f} + weight update {median(weights):.2f}; vLLM paused per update {median(paused):.2f}")  # fmt: skip
    wall = records[-1]["time"] - t0
    generating = records[-1].get("generating_ms", 0) / 1000
    print(f"wall: {wall:.0f} s from run_started to the last step (step 1 at {records[0]['time'] - t0:.0f} s: start-up); "
          f"vLLM had a request in flight {generating:.0f} s ({100 * generating / wall:.0f} %); ETTR {records[-1].get('ettr')}")  # fmt: skip
    diffs = [(r["step"], r["logprob_diff_mean"], r["logprob_diff_max"]) for r in records if r.get("logprob_diff_tokens")]
    if diffs:
        print(f"|trainer - vLLM| log-probs on tokens of the trainer's own weights: mean of step means {statistics.fmean(d[1] for d in diffs):.4f}, "
              f"largest {max(d[2] for d in diffs):.4f} ({len(diffs)} steps had such tokens)")  # fmt: skip
    print(f"plot: {run_dir / 'plot.png'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="read this finished run instead of starting one")
    parser.add_argument("--window", type=int, default=10, help="steps per first/last mean and smoothing (default 10)")
    parser.add_argument("overrides", nargs="*", help=f"Hydra overrides for `rlrun train` (default {' '.join(DEFAULT)})")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.run is not None:
        report(args.run, args.window)
        return 0
    run_dir = Path(tempfile.mkdtemp(prefix="rlrun-bench-learning-")) / "run"
    overrides = args.overrides or DEFAULT
    print(f"rlrun train {' '.join(overrides)} -> {run_dir}; load average {os.getloadavg()[0]:.2f}", flush=True)
    code, wall, memory = run(run_dir, overrides)
    print(f"exit code {code} after {wall:.0f} s; load average now {os.getloadavg()[0]:.2f}")
    print(f"peak memory: the run's process tree {memory.tree_peak >> 20} MB RSS (summed over its processes); the machine's used "
          f"memory rose from {memory.used_before >> 20} MB to at most {memory.used_peak >> 20} MB")  # fmt: skip
    report(run_dir, args.window)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
