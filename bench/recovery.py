"""Recovery on the real stack: token reuse across kills, time to recover, supervisor overhead.

    python bench/recovery.py [--steps N] [--sample-s S] [--victims vllm,actor] [--actor-kills K] [--keep] [hydra overrides...]

Runs ONE `rlrun train` (subprocess, its own session, temporary run directory) with long
generations and the actor's audit trail on (the LONG_GENERATIONS config of
tests/e2e/test_recovery.py, `actor.audit=true`, more steps so the run lasts), and during it:

  1. SIGKILLs the vLLM API server (the child of vllm-0's guard) once >= 200 journaled tokens are
     in flight (groups not delivered yet);
  2. once vLLM is ready again and two more optimizer steps are done, samples for `--sample-s`
     seconds (1 s interval, psutil) the CPU % and RSS of the `rlrun train` process itself, of its
     guard processes (its `rlrun.entrypoints.guard` children), and of the whole process tree;
  3. then, once >= 200 tokens are in flight again, SIGKILLs the actor (`--actor-kills K`: K times,
     each once the previous new actor has journaled tokens and a step was taken; the actor's
     `healthy_after_s` is then 2 s so every kill gets the first failure's backoff, 0.25 s);
  4. waits for the run to finish.

Afterwards it prints, per kill:

  (a) reuse ratio: for the groups in flight at the kill (journaled before it, not delivered
      before it), the tokens journaled before the kill ("streamed before kill"), and how many
      of them are in the delivered samples, at the same offsets ("kept"): kept / streamed.
      Tokens streamed but not yet journaled (at most actor.journal_flush_tokens per sample) are
      not counted: they are not in the audit trail;
  (b) from events.jsonl: kill -> process_failed (the supervisor noticed), process_failed ->
      process_restarted (backoff), process_restarted -> process_ready, and kill -> the first
      token journaled again (vLLM: after it is ready again; actor: by the new actor process),
      and process_restarted -> that token (the new process's own start);
  (c) mean CPU % and max RSS of rlrun itself, of its guards, and of the whole tree.

It prints figures; it asserts nothing about speed. At the end rlrun gets SIGTERM if it still runs
(SIGKILL after a grace period); any process group of the run still alive is SIGKILLed, and the
temporary run directory is removed (unless --keep).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

IN_FLIGHT_TOKENS = 200
BUDGET = 48
STOP_GRACE_S = 30.0
RUN_TIMEOUT_S = 900.0


def overrides(steps: int) -> list[str]:
    """tests/e2e/test_recovery.py's LONG_GENERATIONS with more steps (the run must outlast the
    vLLM restart, the sampling window and the actor kill)."""
    return [
        "recipe=math_grpo", f"trainer.max_train_steps={steps}", "trainer.train_batch_size=64",
        "trainer.checkpoint_every=100", f"actor.max_new_tokens={BUDGET}", "actor.min_new_tokens=40",
        "actor.audit=true", "actor.max_prefix_staleness=1000", "actor.max_concurrent_groups=8",
        "supervisor.stop_grace_s=5", "supervisor.live_view=false",
    ]  # fmt: skip


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


# --- the run as seen from outside ----------------------------------------------------------------


class Run:
    def __init__(self, run_dir: Path, extra: list[str], steps: int) -> None:
        self.run_dir = run_dir
        self.out = run_dir.parent / "rlrun.out"
        argv = [sys.executable, "-m", "rlrun", "train", f"run.dir={run_dir}", *overrides(steps), *extra]
        with open(self.out, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def events(self) -> list[dict]:
        return read_jsonl(self.run_dir / "events.jsonl")

    def audit(self) -> list[dict]:
        return read_jsonl(self.run_dir / "audit" / "actor.jsonl")

    def steps_done(self) -> int:
        steps = (m["step"] for m in read_jsonl(self.run_dir / "metrics.jsonl") if m.get("kind", "step") == "step")  # not an eval record's
        return max(steps, default=0)

    def guard_pids(self) -> list[int]:
        return [e["pid"] for e in self.events() if e["event"] in ("process_started", "process_restarted")]

    def ready_count(self, process: str) -> int:
        return sum(1 for e in self.events() if e["event"] == "process_ready" and e["process"] == process)

    def current_pid(self, process: str) -> int:
        """The pid of the process itself: the child of the guard that leads its group."""
        started = [e for e in self.events() if e["event"] in ("process_started", "process_restarted") and e["process"] == process]
        return psutil.Process(started[-1]["pid"]).children()[0].pid

    def in_flight_tokens(self) -> int:
        records = self.audit()
        delivered = {r["group_id"] for r in records if r["kind"] == "delivered"}
        return sum(len(r["token_ids"]) for r in records if r["kind"] == "journaled" and r["group"] not in delivered)

    def wait_for(self, condition, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise RuntimeError(f"rlrun exited ({self.proc.returncode}) while waiting for {what}; see {self.out}")
            if time.time() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.2)

    def journaled_by_other_pid(self, kill: dict) -> bool:
        return any(r["kind"] == "journaled" and r["time"] > kill["time"] and r["pid"] != kill["pid"] for r in self.audit())

    def kill(self, process: str) -> dict:
        pid = self.current_pid(process)
        in_flight = self.in_flight_tokens()
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        print(f"  SIGKILL {process} (pid {pid}) at step {self.steps_done()} with {in_flight} tokens in flight; load {load()}", flush=True)
        return {"process": process, "pid": pid, "time": killed_at, "in_flight": in_flight, "load": load()}

    def stop(self) -> None:
        """SIGTERM rlrun if it still runs (it stops its processes in order), SIGKILL after a grace
        period; then SIGKILL every process group of the run that still has a member."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        time.sleep(0.5)  # guards notice a dead supervisor within their 0.2 s poll
        markers = ("rlrun", "vllm", "VLLM", "valkey", "redis", "multiprocessing")
        for pgid in set(self.guard_pids()):  # each guard led its own group (vLLM's EngineCore too)
            members = [p for p in psutil.process_iter(["pid", "cmdline", "name"]) if _pgid(p.info["pid"]) == pgid]
            if members and any(any(m in " ".join(p.info["cmdline"] or [p.info["name"] or ""]) for m in markers) for p in members):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                print(f"  killed leftover process group {pgid} ({len(members)} processes)", flush=True)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


# --- (c) supervisor overhead ---------------------------------------------------------------------


def sample_overhead(root_pid: int, seconds: float, interval: float = 1.0) -> dict:
    """CPU % (of one core) and RSS of rlrun itself, its guards, and the whole tree, every
    `interval` s for `seconds`."""
    cache: dict[tuple[int, float], psutil.Process] = {}

    def proc(p: psutil.Process) -> psutil.Process:
        key = (p.pid, p.create_time())
        if key not in cache:
            cache[key] = p
            p.cpu_percent(None)  # first call primes the counter
        return cache[key]

    root = proc(psutil.Process(root_pid))
    samples = []
    time.sleep(interval)
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            children = root.children()
            tree = root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        guards = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "rlrun.entrypoints.guard" in " ".join(child.cmdline()):
                    guards.append(proc(child))
        row = {"rlrun_cpu": 0.0, "rlrun_rss": 0, "guard_cpu": 0.0, "guard_rss": 0, "guard_rss_max_one": 0, "tree_cpu": 0.0, "tree_rss": 0, "guards": 0}
        with contextlib.suppress(psutil.Error):
            row["rlrun_cpu"], row["rlrun_rss"] = root.cpu_percent(None), root.memory_info().rss
        for g in guards:
            with contextlib.suppress(psutil.Error):
                cpu, rss = g.cpu_percent(None), g.memory_info().rss
                row["guard_cpu"] += cpu
                row["guard_rss"] += rss
                row["guard_rss_max_one"] = max(row["guard_rss_max_one"], rss)
                row["guards"] += 1
        row["tree_cpu"], row["tree_rss"] = row["rlrun_cpu"], row["rlrun_rss"]
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p = proc(p)
                row["tree_cpu"] += p.cpu_percent(None)
                row["tree_rss"] += p.memory_info().rss
        samples.append(row)
        time.sleep(interval)
    return {"samples": samples, "load": load()}


# --- (a) reuse ratio and (b) timings -------------------------------------------------------------


def reuse(records: list[dict], killed_at: float) -> dict:
    """Tokens journaled before the kill for groups in flight at the kill, and how many of them
    are in the delivered samples at the same offsets."""
    delivered_at = {r["group_id"]: r["time"] for r in records if r["kind"] == "delivered"}
    final = {r["group_id"]: {s["index"]: s["completion_ids"] for s in r["samples"]} for r in records if r["kind"] == "delivered"}
    before: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in records:
        if r["kind"] != "journaled" or r["time"] >= killed_at:
            continue
        if delivered_at.get(r["group"], float("inf")) < killed_at:
            continue  # delivered before the kill: not in flight
        prefix = before[(r["group"], r["index"])]
        if r["offset"] == len(prefix):
            prefix += r["token_ids"]
        else:  # a reset (stale prefix) before the kill: the chain starts again
            prefix[:] = prefix[: r["offset"]] + r["token_ids"]
    streamed = kept = 0
    groups = {g for g, _ in before}
    undelivered = 0
    for (group, index), prefix in before.items():
        streamed += len(prefix)
        tokens = final.get(group, {}).get(index)
        if tokens is None:
            undelivered += len(prefix)
            continue
        n = 0
        while n < len(prefix) and n < len(tokens) and prefix[n] == tokens[n]:
            n += 1
        kept += n
    return {"groups": len(groups), "samples": len(before), "streamed": streamed, "kept": kept, "undelivered": undelivered}


def timings(events: list[dict], records: list[dict], kill: dict) -> dict:
    after = [e for e in events if e["time"] >= kill["time"] - 1.0 and e.get("process") == kill["process"]]
    failed = next((e for e in after if e["event"] == "process_failed"), None)
    out: dict[str, float | None | str] = {"failed": None, "restarted": None, "ready": None, "tokens": None, "reason": ""}
    if failed is None:
        return out
    out["reason"] = failed.get("reason", "")
    out["failed"] = failed["time"] - kill["time"]
    restarted = next((e for e in after if e["event"] == "process_restarted" and e["time"] >= failed["time"]), None)
    ready = next((e for e in after if e["event"] == "process_ready" and e["time"] >= failed["time"]), None)
    if restarted is not None:
        out["restarted"] = restarted["time"] - failed["time"]
    if ready is not None:
        out["ready"] = ready["time"] - (restarted or failed)["time"]
        out["failed_to_ready"] = ready["time"] - failed["time"]
    if kill["process"] == "actor":  # the first batch journaled by the new actor process
        first = next((r["time"] for r in records if r["kind"] == "journaled" and r["time"] > kill["time"] and r["pid"] != kill["pid"]), None)
    else:  # the first batch journaled once vLLM is ready again
        first = next((r["time"] for r in records if r["kind"] == "journaled" and ready is not None and r["time"] > ready["time"]), None)
    out["tokens"] = None if first is None else first - kill["time"]
    out["restarted_to_tokens"] = None if first is None or restarted is None else first - restarted["time"]
    return out


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def actor_counters(run_dir: Path) -> str:
    logs = sorted((run_dir / "logs").rglob("actor*.log"))
    lines = [line for log in logs for line in log.read_text(errors="replace").splitlines() if "actor stops (" in line]
    return lines[-1].split("actor stops (", 1)[1].rstrip(")") if lines else "(no closing line)"


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="trainer.max_train_steps of the run (default 50)")
    parser.add_argument("--sample-s", type=float, default=30.0, help="seconds of CPU/RSS sampling (default 30)")
    parser.add_argument("--victims", default="vllm,actor", help="what to kill, in this order: vllm, actor or both (default)")
    parser.add_argument("--actor-kills", type=int, default=1, help="SIGKILLs of the actor, one after another's recovery (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for `rlrun train`")
    args = parser.parse_args(argv)
    victims = {v.strip() for v in args.victims.split(",") if v.strip()}
    if not victims <= {"vllm", "actor"}:
        parser.error(f"--victims: expected vllm and/or actor, got {args.victims!r}")
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every child is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    print(f"load average at start: {load()} (1/5/15 min), {os.cpu_count()} CPUs", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="rlrun-bench-recovery-"))
    extra = list(args.overrides)
    if args.actor_kills > 1:  # every kill measured as a first failure after a healthy period (1 s backoff)
        extra = ["supervisor.actor.healthy_after_s=2", f"supervisor.actor.max_restarts={args.actor_kills + 1}", *extra]
    run = Run(tmp / "run", extra, args.steps)
    started = time.time()
    kills: list[dict] = []
    overhead: dict | None = None
    try:
        run.wait_for(lambda: run.in_flight_tokens() >= IN_FLIGHT_TOKENS, 600, "long generations in flight")
        if "vllm" in victims:
            kills.append(run.kill("vllm-0"))
            run.wait_for(lambda: run.ready_count("vllm-0") >= 2, 600, "vLLM ready again")
        if args.sample_s > 0:
            mark = run.steps_done()
            run.wait_for(lambda: run.steps_done() >= mark + 2, 300, "two more steps")
            print(f"  sampling rlrun's CPU/RSS for {args.sample_s:.0f} s from step {run.steps_done()}; load {load()}", flush=True)
            overhead = sample_overhead(run.proc.pid, args.sample_s)
            overhead["steps"] = f"{mark + 2}->{run.steps_done()}"
        for _ in range(args.actor_kills if "actor" in victims else 0):
            if kills and kills[-1]["process"] == "actor":  # the last kill recovered, a step taken since
                last, mark = kills[-1], run.steps_done()
                run.wait_for(lambda: run.journaled_by_other_pid(last), 120, "the new actor's first tokens")
                run.wait_for(lambda: run.steps_done() >= mark + 1, 300, "a step after the actor's restart")
            run.wait_for(lambda: run.in_flight_tokens() >= IN_FLIGHT_TOKENS, 300, "tokens in flight again")
            kills.append(run.kill("actor"))
        run.proc.wait(timeout=RUN_TIMEOUT_S)
    except RuntimeError as exc:
        print(f"  the run did not go as planned: {exc}", flush=True)
    finally:
        run.stop()
    wall = time.time() - started
    events, records = run.events(), run.audit()
    code = run.proc.returncode
    print()
    print(f"run: exit code {code}, {run.steps_done()} steps in {wall:.0f} s, group size 8, max_new_tokens {BUDGET}, load average now {load()}")

    print("(a) token reuse across a SIGKILL (tokens journaled before the kill, groups in flight at the kill)")
    print(f"    {'victim':<7} | {'in flight':>9} | {'groups':>6} | {'samples':>7} | {'streamed':>8} | {'kept':>6} | {'not deliv.':>10} | {'reuse':>6} | load at kill")
    for kill in kills:
        r = reuse(records, kill["time"])
        ratio = r["kept"] / r["streamed"] if r["streamed"] else float("nan")
        print(
            f"    {kill['process']:<7} | {kill['in_flight']:>9} | {r['groups']:>6} | {r['samples']:>7} | {r['streamed']:>8} | "
            f"{r['kept']:>6} | {r['undelivered']:>10} | {ratio:>6.4f} | {kill['load']}"
        )
    print(f"    last actor's counters: {actor_counters(run.run_dir)}")

    print("(b) recovery time, s (from events.jsonl; the supervisor polls every 0.5 s, the guard every 0.2 s)")
    print(f"    {'victim':<7} | {'kill->failed':>12} | {'failed->restarted':>17} | {'restarted->ready':>16} | {'failed->ready':>13} | {'kill->tokens again':>18} | {'restarted->tokens':>17} | reason")
    for kill in kills:
        t = timings(events, records, kill)
        print(
            f"    {kill['process']:<7} | {fmt(t['failed']):>12} | {fmt(t['restarted']):>17} | {fmt(t['ready']):>16} | "
            f"{fmt(t.get('failed_to_ready')):>13} | {fmt(t['tokens']):>18} | {fmt(t.get('restarted_to_tokens')):>17} | {t['reason']}"
        )

    print("(c) supervisor overhead (CPU % of one core, psutil, 1 s samples)")
    if overhead and overhead["samples"]:
        s = overhead["samples"]
        n = len(s)

        def mean(key: str) -> float:
            return sum(x[key] for x in s) / n

        mb = 1024 * 1024
        print(f"    {n} samples over steps {overhead['steps']}, load after {overhead['load']}")
        print(f"    rlrun train itself : mean CPU {mean('rlrun_cpu'):5.1f} %, max RSS {max(x['rlrun_rss'] for x in s) / mb:6.1f} MB")
        print(
            f"    its {max(x['guards'] for x in s)} guards       : mean CPU {mean('guard_cpu'):5.1f} % (all together), max RSS "
            f"{max(x['guard_rss'] for x in s) / mb:6.1f} MB together, {max(x['guard_rss_max_one'] for x in s) / mb:5.1f} MB the largest"
        )
        print(f"    whole process tree : mean CPU {mean('tree_cpu'):5.1f} %, max RSS {max(x['tree_rss'] for x in s) / mb:6.1f} MB (RSS summed, shared pages counted twice)")
        share = (mean("rlrun_cpu") + mean("guard_cpu")) / mean("tree_cpu") if mean("tree_cpu") else float("nan")
        print(f"    rlrun + guards share of the tree's CPU: {100 * share:.1f} %")
    else:
        print("    no samples (the run ended or failed before the sampling window)")

    if args.keep:
        print(f"run directory kept: {run.run_dir}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
