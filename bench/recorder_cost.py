"""The trainer recorder's cost per step as a run grows: ETTR over the whole history, then and now.

    python bench/recorder_cost.py [--sizes 10,10000,100000] [--steps 5]

For each size N, a run directory with N step records in metrics.jsonl and a realistic events.jsonl
(launches stopped and resumed, each role started and ready, a failure and restart of some role
every ~400 steps, a stall now and then), then `--steps` more steps recorded the way
rlrun/trainer/recorder.py does, timed each, in two modes:

  - whole: what the recorder did before: read all of events.jsonl again and split_wall_time over
    every step record so far (held in memory);
  - running: what it does now: the events appended since the last step (EventTail) folded into
    RunningEttr.

Both append the step's line to metrics.jsonl and its events, as a run would, and each figure is
the mean time per step in milliseconds. The recorder's one-off work when a trainer starts is
printed apart: reading the history, and (running) its first step, which splits the whole history
once, since only a step of the new trainer tells which recorded steps it will take again. Both
modes' ETTR must agree: the script says so. It prints figures; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlrun.supervisor.events import EventTail, read_events  # noqa: E402
from rlrun.telemetry.ettr import RunningEttr, split_wall_time  # noqa: E402
from rlrun.telemetry.metrics import read_metrics  # noqa: E402

ROLES = ("redis", "vllm-0", "trainer", "actor")


class SyntheticRun:
    """A run's events and step records, step by step, written to a run directory as a run would."""

    def __init__(self, root: Path, seed: int = 0) -> None:
        self.events_path, self.metrics_path = root / "events.jsonl", root / "metrics.jsonl"
        self.rng = random.Random(seed)
        self.t, self.step = 1_700_000_000.0, 0
        self._emit([self._launch("run_started")])

    def _launch(self, kind: str) -> list[dict]:
        events = [{"time": self.t, "event": kind, "launch": 1}]
        for i, role in enumerate(ROLES):
            events += [
                {"time": round(self.t + i, 3), "event": "process_started", "process": role, "pid": 100 + i, "attempt": 1},
                {"time": round(self.t + i + 0.5, 3), "event": "process_ready", "process": role, "pid": 100 + i},
            ]  # fmt: skip
        self.t += 30
        return events

    def _emit(self, batches: list[list[dict]]) -> None:
        with open(self.events_path, "a") as handle:
            for events in batches:
                handle.writelines(json.dumps(e) + "\n" for e in events)

    def next_step(self) -> dict:
        """The events up to the next step, appended to events.jsonl; the step's record (not written)."""
        rng, events = self.rng, []
        if self.step and self.step % 5000 == 0:  # the launch stops; the run is resumed
            events += [{"time": round(self.t, 3), "event": "run_stopped", "status": "stopped"}]
            self.t += 600
            events += self._launch("run_resumed")
        elif rng.random() < 1 / 400:
            role = rng.choice(ROLES[1:])
            if rng.random() < 0.3:
                events.append({"time": round(self.t, 3), "event": "process_stalled", "process": role, "quiet_s": 5.0})
            events += [
                {"time": round(self.t + 0.1, 3), "event": "process_failed", "process": role, "reason": "exit 1", "action": "restart"},
                {"time": round(self.t + 2, 3), "event": "process_restarted", "process": role, "attempt": 2},
                {"time": round(self.t + 4, 3), "event": "process_ready", "process": role, "pid": 200},
            ]  # fmt: skip
        self._emit([events])
        step_time = rng.uniform(4, 12)
        self.t += step_time + rng.uniform(0.01, 0.1)
        self.step += 1
        wait = rng.uniform(0, step_time / 3)
        return {"step": self.step, "time": round(self.t, 3), "step_time_s": round(step_time, 6), "wait_s": round(wait, 6), "weights_s": 0.2}

    def write(self, record: dict) -> None:
        with open(self.metrics_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")


def measure(size: int, steps: int, mode: str) -> tuple[float, float, list]:
    """(the recorder's start and first step in ms, its mean time per step after in ms, the ETTR
    figures) at step `size`."""
    with tempfile.TemporaryDirectory(prefix="recorder-cost-") as tmp:
        run = SyntheticRun(Path(tmp))
        for _ in range(size):
            run.write(run.next_step())
        started = time.perf_counter()
        history = read_metrics(run.metrics_path)
        if mode == "running":
            tail = EventTail(run.events_path)
            ettr = RunningEttr(tail.read(), history, reload=lambda: (read_events(run.events_path), read_metrics(run.metrics_path)))
        start_ms, spent, figures = (time.perf_counter() - started) * 1000, 0.0, []
        for i in range(steps + 1):
            record = run.next_step()
            began = time.perf_counter()
            if mode == "running":
                ratio = ettr.add(tail.read(), record, now=record["time"])
            else:
                history.append(record)
                ratio = split_wall_time(read_events(run.events_path), history, now=record["time"]).ettr
            record["ettr"] = round(ratio, 4) if ratio is not None else None
            run.write(record)
            if i == 0:
                start_ms += (time.perf_counter() - began) * 1000
            else:
                spent += time.perf_counter() - began
            figures.append(record["ettr"])
        return start_ms, spent / steps * 1000, figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,10000,100000", help="history sizes (steps), comma-separated")
    parser.add_argument("--steps", type=int, default=5, help="steps timed at each size")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f}; mean of {args.steps} steps each, after a first one")
    print(f"{'step':>8} {'whole ms/step':>14} {'running ms/step':>16} {'running start ms':>17}  ettr")
    for size in sizes:
        _, whole, whole_figures = measure(size, args.steps, "whole")
        start, running, running_figures = measure(size, args.steps, "running")
        agree = "same" if whole_figures == running_figures else f"DIFFER {whole_figures} {running_figures}"
        print(f"{size:>8} {whole:>14.3f} {running:>16.3f} {start:>17.1f}  {agree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
