"""Fault injection demo: a run that loses a random role every few minutes, and what it cost.

    python bench/faults.py [--minutes 15] [--every 5] [--seed 0] [--roles vllm,actor,trainer]
                           [--keep] [hydra overrides...]
    python bench/faults.py --minutes 6 --every 2                 # a quick check
    python bench/faults.py inference.num_servers=2               # a lost vLLM server: the other goes on

Starts one `rlrun train` (subprocess, its own session, temporary run directory; default recipe
math_gspo with `trainer.max_train_steps` large enough that the run lasts), and at every `--every`
minutes after its start (up to `--minutes`) SIGKILLs the process of one role drawn at random
(seeded; each role once before any twice): the vLLM API server (one of them, with several servers), the actor, the trainer, or
Redis (`--roles ...,redis`). At `--minutes` it stops the run with SIGTERM (rlrun stops its
processes in order) and reads the run's records with rlrun/telemetry/ettr.py, the reader `rlrun status`
uses. Printed:

  - per kill: the role, the step at the kill, the recovery (failure -> the end of the first step
    after it), the steps retaken (recorded before the failure and taken again after it: a
    trainer restart goes back to its last checkpoint), the tokens the actor generated again and
    those it kept and continued across the recovery, and the restart itself
    (process_failed -> process_ready), from events.jsonl;
  - the run's wall time split into training / waiting / weights / recovery / start_stop / other,
    ETTR = training / wall, and the share of the wall time lost to the failures (recovery): ETTR
    also counts waiting for rollouts and weight updates as not training, so it is below 1 even
    without a failure (about 0.56 for a failure-free math_gspo run on 2 cores), and 1 - recovery
    / wall is the part of the figure the failures alone decide.

It prints figures; it asserts nothing about speed. Any process group of the run still alive at
the end is SIGKILLed, and the temporary run directory is removed unless --keep.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/recovery.py: the run seen from outside
from recovery import Run, load  # noqa: E402

ROLES = ("vllm", "actor", "trainer", "redis")
MATCH_S = 5.0  # a failure recorded this long after a kill is that kill's
GOAL_ETTR = 0.85


@dataclass(frozen=True)
class Kill:
    at_s: float  # seconds after the run's start
    role: str


def schedule(minutes: float, every: float, roles: list[str], seed: int) -> list[Kill]:
    """A kill every `every` minutes, strictly before the end, of a role drawn with `seed`: the
    roles in a random order, then again in another, so no role is hit twice before every role
    was hit once (three kills cover vLLM, the actor and the trainer)."""
    if every <= 0 or minutes <= 0:
        raise ValueError("--minutes and --every must be > 0")
    rng = random.Random(seed)
    count = int((minutes - 1e-9) // every)
    drawn: list[str] = []
    while len(drawn) < count:  # a seeded shuffle of the roles, again and again: each role in turn
        cycle = list(roles)
        rng.shuffle(cycle)
        drawn += cycle
    return [Kill(at_s=60.0 * every * (i + 1), role=role) for i, role in enumerate(drawn[:count])]


def process_names(events: list[dict], role: str) -> list[str]:
    """The run's processes of `role` (vLLM: every server, vllm-0, vllm-1, ...)."""
    names = {e["process"] for e in events if e.get("event") in ("process_started", "process_restarted") and "process" in e}
    if role == "vllm":
        return sorted(n for n in names if n.startswith("vllm-"))
    return [role] if role in names else []


def failure_of(kill: dict, failures: list) -> object | None:
    """The failure recorded for `kill` (same process, within MATCH_S after it), if any."""
    return next((f for f in failures if f.process == kill["process"] and 0 <= f.time - kill["time"] <= MATCH_S), None)


def restart_s(events: list[dict], kill: dict) -> float | None:
    """process_failed -> process_ready (or process_restarted for roles without a readiness probe)."""
    after = [e for e in events if e.get("process") == kill["process"] and e["time"] >= kill["time"]]
    failed = next((e for e in after if e["event"] == "process_failed"), None)
    if failed is None:
        return None
    ready = next((e for e in after if e["event"] == "process_ready" and e["time"] >= failed["time"]), None)
    return None if ready is None else ready["time"] - failed["time"]


class FaultRun(Run):
    """`rlrun train` for the demo; a kill names no tokens in flight (no audit trail here)."""

    def __init__(self, run_dir: Path, extra: list[str]) -> None:
        self.run_dir = run_dir
        self.out = run_dir.parent / "rlrun.out"
        argv = [
            sys.executable, "-m", "rlrun", "train", f"run.dir={run_dir}", "recipe=math_gspo",
            "trainer.max_train_steps=1000000", "supervisor.live_view=false", *extra,
        ]  # fmt: skip
        with open(self.out, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self, process: str) -> dict:
        pid = self.current_pid(process)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        print(f"  SIGKILL {process} (pid {pid}) at step {self.steps_done()}; load {load()}", flush=True)
        return {"process": process, "pid": pid, "time": killed_at}


def fmt(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="length of the run, from its launch (default 15)")
    parser.add_argument("--every", type=float, default=5.0, help="minutes between kills (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the roles drawn (default 0)")
    parser.add_argument("--roles", default="vllm,actor,trainer", help=f"roles to draw from, among {','.join(ROLES)}")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for `rlrun train`")
    args = parser.parse_args(argv)
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    if not roles or not set(roles) <= set(ROLES):
        parser.error(f"--roles: expected some of {','.join(ROLES)}, got {args.roles!r}")
    try:
        plan = schedule(args.minutes, args.every, roles, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the run is stopped on the way out

    print(f"load average at start: {load()} (1/5/15 min); plan: " + ", ".join(f"{k.role} at {k.at_s / 60:g} min" for k in plan), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="rlrun-bench-faults-"))
    run = FaultRun(tmp / "run", list(args.overrides))
    started = time.time()
    rng = random.Random(args.seed + 1)  # which vLLM server, when there are several
    kills: list[dict] = []
    try:
        for planned in plan:
            while time.time() - started < planned.at_s:
                if run.proc.poll() is not None:
                    raise RuntimeError(f"rlrun exited ({run.proc.returncode}) before the kill at {planned.at_s / 60:g} min; see {run.out}")
                time.sleep(0.2)
            names = process_names(run.events(), planned.role)
            if not names:
                print(f"  {planned.role}: no such process in this run; no kill", flush=True)
                continue
            try:
                kills.append({**run.kill(rng.choice(names)), "step": run.steps_done(), "at_s": time.time() - started})
            except (IndexError, psutil.Error) as exc:  # between a death and its restart: no process to kill
                print(f"  {planned.role}: could not be killed now ({exc!r})", flush=True)
        while time.time() - started < 60.0 * args.minutes and run.proc.poll() is None:
            time.sleep(0.5)
        if run.proc.poll() is not None:
            print(f"  rlrun exited early ({run.proc.returncode}); see {run.out}", flush=True)
    except RuntimeError as exc:
        print(f"  the run did not go as planned: {exc}", flush=True)
    finally:
        run.stop()

    from rlrun.telemetry.ettr import split_wall_time
    from rlrun.telemetry.metrics import read_metrics

    events = run.events()
    split = split_wall_time(events, read_metrics(run.run_dir / "metrics.jsonl"))
    print()
    print(f"run: exit code {run.proc.returncode}, {run.steps_done()} steps in {time.time() - started:.0f} s, load average now {load()}")
    print("per kill (recovery: the failure -> the end of the first step after it; restart: process_failed -> process_ready)")
    print(f"    {'at min':>6} | {'victim':<8} | {'step':>5} | {'recovery s':>10} | {'restart s':>9} | {'steps retaken':>13} | {'tokens regen.':>13} | {'tokens reused':>13}")
    for kill in kills:
        f = failure_of(kill, split.failures)
        print(
            f"    {kill['at_s'] / 60:>6.1f} | {kill['process']:<8} | {kill['step']:>5} | {fmt(f and f.recovery_s):>10} | "
            f"{fmt(restart_s(events, kill)):>9} | {fmt(f and f.steps_retaken, 0):>13} | {fmt(f and f.tokens_regenerated, 0):>13} | "
            f"{fmt(f and f.tokens_reused, 0):>13}"
        )
    others = [f for f in split.failures if not any(failure_of(k, [f]) for k in kills)]
    for f in others:
        print(f"    not injected: {f.process} ({f.reason}), recovery {fmt(f.recovery_s)} s, {f.steps_retaken} steps retaken")
    if split.ettr is None:
        print("ETTR: not measured (no step records)")
        return 1
    wall = split.wall_s
    totals = split.to_dict()
    print("wall time split: " + ", ".join(f"{name} {value:.0f} s ({100 * value / wall:.1f} %)" for name, value in split.seconds.items()))
    print(
        f"ETTR {split.ettr:.3f} (training / wall, {wall:.0f} s); lost to the {len(split.failures)} failure(s): "
        f"{split.seconds['recovery']:.0f} s ({100 * split.seconds['recovery'] / wall:.1f} % of the wall time), "
        f"{totals['steps_retaken']} steps retaken, {totals['tokens_regenerated']} tokens regenerated"
    )
    # ETTR counts waiting for rollouts and weight updates as not training, failures or not: the
    # share of the wall time the failures did not take is the fault-tolerance figure on its own.
    kept = 1 - split.seconds["recovery"] / wall
    print(f"goal ETTR >= {GOAL_ETTR}: {'met' if split.ettr >= GOAL_ETTR else 'NOT met'} ({split.ettr:.3f}); "
          f"wall time not lost to failures: {kept:.3f} ({'>=' if kept >= GOAL_ETTR else '<'} {GOAL_ETTR})")  # fmt: skip
    if args.keep:
        print(f"run directory kept: {run.run_dir}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
