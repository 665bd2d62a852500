"""What `rlrun status`, `rlrun runs` and `rlrun logs` read back from run directories (running or
finished): replaying the supervisor's events gives each process's last pid, state, restarts and
log, without asking the (possibly dead) supervisor anything.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from rlrun.errors import RunDirError
from rlrun.run import runlock
from rlrun.rundir import RunDir
from rlrun.supervisor.events import read_events
from rlrun.telemetry.ettr import TimeSplit, split_wall_time
from rlrun.telemetry.metrics import RECOVERY_COUNTERS, eval_records, final_records, read_metrics

DAMAGED = "damaged"  # `rlrun runs`: a run whose files cannot be read (its entry's note says why)
# `status` and `runs` show the mean reward of this many last steps beside the last step's: one
# step's mean over a few groups is noisy (0.59 for a run whose last 10 steps averaged 0.84).
REWARD_WINDOW = 10

# The state each supervisor event leaves a process in.
EVENT_STATES = {
    "process_started": "starting",
    "process_restarted": "starting",
    "process_ready": "ready",
    "process_exited": "exited",
    "process_failed": "failed",
    "process_stalled": "stalled",
    "process_stopping": "stopping",
    "process_killed": "stopping",
}


@dataclass
class ProcessRow:
    name: str
    pid: Optional[int] = None
    state: str = "pending"
    restarts: int = 0
    last_failure: str = ""
    log: str = ""
    since: Optional[float] = None  # time of the last state change
    last_dump: str = ""  # the diagnostics file of the last stack dump taken before a kill


def replay_events(events: list[dict]) -> list[ProcessRow]:
    """Each process's last known state, in start order. Pure: events in, rows out."""
    rows: dict[str, ProcessRow] = {}
    for event in events:
        name = event.get("process")
        kind = event.get("event")
        if name and kind == "stack_dump":
            rows.setdefault(name, ProcessRow(name)).last_dump = event.get("file") or ""
        if not name or kind not in EVENT_STATES:
            continue
        row = rows.setdefault(name, ProcessRow(name))
        row.state = EVENT_STATES[kind]
        row.since = event.get("time")
        if kind in ("process_started", "process_restarted"):
            row.pid = event.get("pid")
            row.log = event.get("log", row.log)
        if kind == "process_restarted":
            row.restarts += 1
        if kind == "process_failed":
            row.last_failure = event.get("reason", "")
            if event.get("action") == "restart":
                row.state = "backoff"
    stopped = any(e.get("event") == "run_stopped" for e in events)
    for row in rows.values():
        if stopped and row.state in ("stopping", "ready", "starting", "backoff"):
            row.state = "stopped"
    return list(rows.values())


def load(run_dir: RunDir) -> tuple[dict, list[ProcessRow], Optional[dict]]:
    """(state.json, process rows, last metrics record — or, for a trainer that writes none, its
    last announced step) of a run directory. A SLURM job's run (world=slurm) also gets
    `slurm_job_state`: the job's state in SLURM's queue now."""
    run_dir.require_run()
    events = read_events(run_dir.events)
    metrics = read_metrics(run_dir.metrics)
    state = run_dir.read_state()
    job = state.get("slurm_job_id")
    if job:
        from rlrun.cluster.slurm_job import queue_state

        state["slurm_job_state"] = queue_state(str(job))
    if state.get("status") == "running" and runlock.holder(run_dir) is None:
        if not job:
            state["status"] = "running (supervisor gone: rlrun was killed; use `rlrun resume`)"
        elif state["slurm_job_state"] not in ("RUNNING", "COMPLETING"):  # (its lock may not be seen from another node)
            state["status"] = (
                f"running (SLURM job {job} is not running: {state['slurm_job_state'] or 'gone'}; use `rlrun resume`)"
            )
    rows = replay_events(events)
    for row in rows:  # this run directory's files, wherever the run was when they were recorded
        row.log = str(run_dir.here(row.log)) if row.log else ""
        row.last_dump = str(run_dir.here(row.last_dump)) if row.last_dump else ""
    return state, rows, (metrics[-1] if metrics else announced_step(events))


def gpu_usage(run_dir: RunDir, rows: list[ProcessRow], nvml_factory=None) -> tuple[dict, str]:
    """(process → its GPUs, memory and utilisation, a note) for a world=local run on GPUs: its GPUs
    from the launch's `gpus_placed` event, memory and utilisation asked of NVML while it runs.
    ({}, "") for a run not on GPUs; the note says why NVML was not asked."""
    from rlrun.cluster import gpus

    placed = next((e for e in reversed(read_events(run_dir.events)) if e.get("event") == "gpus_placed"), None)
    if placed is None:
        return {}, ""
    nvml, note = None, ""
    if runlock.holder(run_dir) is None:
        note = "not running: GPU memory and utilisation are shown while it runs"
    else:
        try:
            nvml = (nvml_factory or gpus.open_nvml)()
        except gpus.NvmlUnavailable as exc:
            note = f"GPU memory and utilisation unknown: {exc}"
    live = {row.name: row.pid for row in rows if row.state in ("starting", "ready")}
    return {
        name: {**asdict(u), "gpus": list(u.gpus)}
        for name, u in gpus.usage(placed.get("gpus") or {}, live, nvml).items()
    }, note


def report(run_dir: RunDir) -> dict:
    """One run as plain data (what `rlrun status --json` prints)."""
    state, rows, last = load(run_dir)
    last = last or {}
    events = read_events(run_dir.events)
    failure = next((e for e in reversed(events) if e.get("event") == "process_failed"), None)
    shown = ("time", "event", "process", "reason", "status", "file")
    smoothed = recent_reward(read_metrics(run_dir.metrics))
    progress = {
        "step": last.get("step", 0),
        "max_train_steps": _max_train_steps(run_dir),
        "samples": last.get("samples", 0),
        "reward_mean": last.get("reward_mean"),
        "reward_smoothed": smoothed[0] if smoothed else None,
        "reward_smoothed_steps": smoothed[1] if smoothed else 0,
        "policy_version": last.get("policy_version"),
        "time": last.get("time"),
        "eval": latest_eval(run_dir),
    }
    return {
        "run_dir": str(run_dir.root),
        "status": state.get("status", "unknown"),
        "live": runlock.holder(run_dir) is not None
        or (state.get("status") == "running" and state.get("slurm_job_state") == "RUNNING"),
        "slurm_job": {"id": state["slurm_job_id"], "state": state.get("slurm_job_state")}
        if state.get("slurm_job_id")
        else None,
        "processes": [asdict(row) for row in rows],
        "restarts": sum(row.restarts for row in rows),
        "last_failure": failure and {k: failure.get(k) for k in ("time", "process", "reason", "action")},
        "progress": progress,
        "ettr": time_split(run_dir).to_dict(),
        "recovery": recovery(last),
        "reward_failures": reward_failures(last),
        "last_event": {k: v for k, v in events[-1].items() if k in shown} if events else None,
        "gpus": dict(zip(("processes", "note"), gpu_usage(run_dir, rows))),
    }


def recent_reward(records: list[dict], window: int = REWARD_WINDOW) -> Optional[tuple[float, int]]:
    """(mean of `reward_mean` over the last `window` steps, how many steps it averages); a retaken
    step counts once, as last written, and a step without a reward is left out. None: no reward."""
    rewards = [r["reward_mean"] for r in final_records(records)[-window:] if "reward_mean" in r]
    return (statistics.fmean(rewards), len(rewards)) if rewards else None


def latest_eval(run_dir: RunDir) -> Optional[dict]:
    """The held-out evaluation of the newest evaluated policy version (`eval_figures`); None: none."""
    records = eval_records(run_dir.metrics)
    return eval_figures(records[-1]) if records else None


EVAL_SHOWN = ("policy_version", "prompts", "k", "reward_mean", "pass@1")


def eval_figures(record: dict) -> dict:
    """What `status` and `runs` show of an eval record: its version, prompts, k, reward_mean, pass@1
    and pass@k, per source too when it has sources (`per_source`), and its time. A figure that is
    not a finite number (a damaged line) is None."""

    def figures(part: dict) -> dict:
        k = part.get("k")
        keys = (*EVAL_SHOWN, f"pass@{k}") if type(k) is int and k > 1 else EVAL_SHOWN
        return {key: part[key] if _finite(part.get(key)) else None for key in keys}

    out = {**figures(record), "time": record.get("time") if _finite(record.get("time")) else None}
    sources = record.get("per_source")
    if isinstance(sources, dict) and sources:
        out["per_source"] = {str(s): figures(part) for s, part in sources.items() if isinstance(part, dict)}
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def recovery(record: dict) -> Optional[dict]:
    """The actor's recovery counters in a metrics record (None: it has none, e.g. trainer=fast_llm)."""
    if not any(key in record for key in RECOVERY_COUNTERS):
        return None
    return {key: record.get(key) if type(record.get(key)) is int else 0 for key in RECOVERY_COUNTERS}


def reward_failures(record: dict) -> dict:
    """Per reward function, its failed calls so far ({name: {"errors": n, "timeouts": n}}) and the
    groups dropped for them, from a metrics record; empty when nothing failed."""
    names = sorted({*(record.get("reward_errors") or {}), *(record.get("reward_timeouts") or {})})
    out: dict = {
        name: {
            "errors": (record.get("reward_errors") or {}).get(name, 0),
            "timeouts": (record.get("reward_timeouts") or {}).get(name, 0),
        }
        for name in names
    }
    if record.get("groups_dropped"):
        out["groups_dropped"] = record["groups_dropped"]
    return out


def describe_reward_failures(failures: dict) -> str:
    """'reward failures: flaky 3 raised, slow 2 timed out; 1 group dropped' for people."""
    parts = [
        ", ".join(f"{n} {what}" for n, what in ((c["errors"], "raised"), (c["timeouts"], "timed out")) if n)
        for name, c in failures.items()
        if name != "groups_dropped"
    ]
    names = [name for name in failures if name != "groups_dropped"]
    text = "reward failures (scored by reward.on_error; first traceback in the actor's log): " + "; ".join(
        f"{name} {part}" for name, part in zip(names, parts)
    )
    dropped = failures.get("groups_dropped")
    return text + (f"; {dropped} group(s) dropped" if dropped else "")


def describe_recovery(counts: dict) -> str:
    """'tokens kept: 13 from the journal at actor restarts (1 sample continued), ...' for people."""
    return (
        f"tokens kept: {counts['tokens_reused']} from the journal at actor restarts ({counts['samples_continued']} samples continued), "
        f"{counts['tokens_kept_on_retry']} after failed requests ({counts['samples_continued_on_retry']} samples continued); "
        f"{counts['tokens_regenerated']} regenerated ({counts['prefixes_dropped_stale']} stale prefixes dropped)"
    )


def announced_step(events: list[dict]) -> Optional[dict]:
    """The last step a trainer without metrics.jsonl (Fast-LLM) announced, as the supervisor
    recorded it (`trainer_step` events: its `weights_ready` step and documents seen); None if none."""

    def counts(e: dict) -> bool:  # a damaged line is skipped, as read_events skips one
        return type(e.get("step")) is int and (e.get("samples") is None or type(e.get("samples")) is int)

    event = next((e for e in reversed(events) if e.get("event") == "trainer_step" and counts(e)), None)
    if event is None:
        return None
    return {
        "step": event["step"],
        "samples": event.get("samples") or 0,
        "policy_version": event["step"],
        "time": event.get("time"),
    }


def time_split(run_dir: RunDir) -> TimeSplit:
    """The run's wall time split (rlrun/telemetry/ettr.py); a running run is counted up to now."""
    now = time.time() if runlock.holder(run_dir) is not None else None
    return split_wall_time(read_events(run_dir.events), read_metrics(run_dir.metrics), now=now)


def list_runs(root: Path) -> list[dict]:
    """One summary per run directly under `root` (or `root` itself), newest first; a run whose files
    cannot be read is one entry of status "damaged" with a `note` saying which file and why."""
    root = Path(root)
    if not root.is_dir():
        raise RunDirError(
            f"{root} is not a directory. Give the folder your runs are in (run.runs_root, default runs/)."
        )
    candidates = [root] if RunDir(root).is_run() else sorted(p for p in root.iterdir() if p.is_dir())
    runs: list[dict[str, Any]] = []
    for path in candidates:
        run_dir = RunDir(path.resolve())
        if not run_dir.is_run():
            continue
        try:
            full = report(run_dir)
        except (RunDirError, OSError, ValueError) as exc:  # one damaged run does not hide the others
            note = " ".join(str(exc).split()) if isinstance(exc, RunDirError) else f"{type(exc).__name__}: {exc}"
            runs.append(
                {
                    "run_dir": str(path),
                    "status": DAMAGED,
                    "note": note,
                    "step": None,
                    "reward_mean": None,
                    "reward_smoothed": None,
                    "reward_smoothed_steps": 0,
                    "eval": None,
                    "ettr": None,
                    "restarts": 0,
                    "last_event": None,
                    "updated": None,
                }
            )
            continue
        progress = full["progress"]
        files = (run_dir.events, run_dir.metrics, run_dir.state)
        runs.append(
            {
                "run_dir": full["run_dir"],
                "status": full["status"],
                "step": progress["step"],
                "max_train_steps": progress["max_train_steps"],
                "reward_mean": progress["reward_mean"],
                "reward_smoothed": progress["reward_smoothed"],
                "reward_smoothed_steps": progress["reward_smoothed_steps"],
                "eval": progress["eval"],
                "ettr": full["ettr"]["ettr"],
                "restarts": full["restarts"],
                "last_event": full["last_event"],
                "updated": max((p.stat().st_mtime for p in files if p.is_file()), default=None),
            }
        )
    return sorted(runs, key=lambda r: r["updated"] or 0, reverse=True)


def describe_split(split: TimeSplit) -> str:
    """'ETTR 0.72 of 310 s: training 223 s, waiting 40 s, ...; 1 failure: ...' for people."""
    if split.ettr is None:
        return "ETTR: not measured (no step records in metrics.jsonl yet; trainer=fast_llm writes none)"
    parts = ", ".join(f"{name.replace('_', '/')} {value:.0f} s" for name, value in split.seconds.items())
    text = f"ETTR {split.ettr:.2f} of {split.wall_s:.0f} s: {parts}"
    if split.failures:
        costs = "; ".join(
            f"{f.process} {'recovered in ' + format(f.recovery_s, '.1f') + ' s' if f.recovery_s is not None else 'not recovered yet'}"
            f", {f.steps_retaken} steps retaken, {f.tokens_regenerated} tokens regenerated"
            for f in split.failures
        )
        text += f"\n{len(split.failures)} failure(s): {costs}"
    return text


def _max_train_steps(run_dir: RunDir) -> Optional[int]:
    try:
        value = (yaml.safe_load(run_dir.config.read_text()) or {}).get("trainer", {}).get("max_train_steps")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def latest_log(run_dir: RunDir, process: str, launch: Optional[int] = None) -> Path:
    """The log of `process`'s latest start attempt in launch `launch` (default: the newest launch)."""
    if launch is not None:
        return _attempt_log(run_dir, process, launch)
    rows = {row.name: row for row in replay_events(read_events(run_dir.events))}
    if process not in rows:
        known = ", ".join(rows) or "none yet"
        raise RunDirError(f"no process named '{process}' in {run_dir.root}. Processes: {known}.")
    if rows[process].log:
        return run_dir.here(rows[process].log)
    launches = run_dir.launches()
    return _attempt_log(run_dir, process, launches[-1]) if launches else run_dir.log(process)


def _attempt_log(run_dir: RunDir, process: str, launch: int) -> Path:
    """The newest attempt's log of `process` in launch `launch` (`<process>.log`, `<process>.<k>.log`)."""
    folder = run_dir.launch_logs(launch)
    if not folder.is_dir():
        have = ", ".join(map(str, run_dir.launches())) or "none"
        raise RunDirError(f"{run_dir.root} has no launch {launch}. Launches: {have}.")
    attempts = {
        0 if p.name == f"{process}.log" else int(p.name[len(process) + 1 : -4]): p
        for p in folder.glob(f"{process}*.log")
        if p.name == f"{process}.log" or p.name[len(process) + 1 : -4].isdigit()
    }
    if not attempts:
        known = sorted({p.name.split(".")[0] for p in folder.glob("*.log")})
        raise RunDirError(
            f"no log of '{process}' in launch {launch} of {run_dir.root}. Processes: {', '.join(known) or 'none'}."
        )
    return attempts[max(attempts)]
