"""A run as a SLURM batch job: the batch script `rlrun submit` writes from the typed config, and
what the job makes of SLURM's signals.

    #SBATCH --signal=B:USR1@<world.signal_lead_s>   the time limit nears: stop in order, requeue
    SIGTERM (scancel, preemption, the limit itself)  stop in order; the job is SLURM's to requeue

The batch script `exec`s `rlrun resume RUN`: every start of the job (the first, each requeue)
continues the run from its directory. A job that keeps starting without a new checkpoint is not
requeued again (`starts_without_progress`). Pure rules, and thin edges that call sbatch, scontrol
and squeue; nothing here knows what the run's processes do.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from rlrun.config.problems import Problems
from rlrun.config.schema import WorldConfig
from rlrun.errors import EnvironmentProblem, RestartsExhausted
from rlrun.rundir import RunDir, read_jsonl

TIME_LIMIT_SIGNAL = "USR1"  # what the batch script's --signal asks SLURM to send before the limit
# Written by slurmstepd into the job's output as it signals the job: "... CANCELLED AT <time> ***"
# for scancel, "... DUE TO PREEMPTION ***", "DUE TO TIME LIMIT", "DUE TO JOB REQUEUE", ...
_CANCELLED = re.compile(r"\*\*\* JOB (\d+) ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
# How a stop by SLURM reads in the run's state ("rlrun status"), by slurmstepd's reason.
STOP_STATUS = {
    "": "cancelled",
    "PREEMPTION": "preempted",
    "TIME LIMIT": "timed out",
    "JOB REQUEUE": "requeued",
    "NODE FAILURE": "node failed",
}
# sbatch options rlrun sets itself, which world.sbatch_lines may not change.
OWN_OPTIONS = ("--output", "-o", "--error", "-e", "--signal", "--requeue", "--no-requeue", "--open-mode", "--parsable")


def time_limit_s(text: str) -> Optional[int]:
    """A SLURM time limit in seconds (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None if it
    is none of them (UNLIMITED included: a job without a limit needs no requeue)."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(text).strip())
    if not match:
        return None
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MM


def sbatch_options(world: WorldConfig, job_name: str, output: Path) -> list[str]:
    """The #SBATCH options of the run's job, from the typed config."""
    options = [f"--job-name={job_name}", f"--nodes={world.nodes}", "--ntasks-per-node=1"]
    options.append(f"--cpus-per-task={world.cpus_per_node}" if world.cpus_per_node else "--exclusive")
    if world.gpus_per_node:
        options.append(f"--gpus-per-node={world.gpus_per_node}")
    options.append(f"--time={world.time}")
    options += [f"--partition={world.partition}"] if world.partition else []
    options += [f"--account={world.account}"] if world.account else []
    options += [
        f"--signal=B:{TIME_LIMIT_SIGNAL}@{world.signal_lead_s}",
        "--requeue" if world.requeue else "--no-requeue",
    ]
    options += ["--open-mode=append", f"--output={output}"]  # every start of the job appends to one file
    return options + [line.strip() for line in world.sbatch_lines]


def batch_script(world: WorldConfig, run_root: Path, job_name: str, python: str, output: Path) -> str:
    """The batch script: #SBATCH lines, then `exec rlrun resume RUN` (exec: rlrun is the batch
    step's process and gets SLURM's signals itself)."""
    lines = ["#!/bin/bash", f"# Written by `rlrun submit` for the run {run_root}; every start of the job continues it."]
    lines += [f"#SBATCH {option}" for option in sbatch_options(world, job_name, output)]
    lines += ["", f"exec {shlex.quote(python)} -m rlrun resume {shlex.quote(str(run_root))}", ""]
    return "\n".join(lines)


def own_option_problems(lines: list[str]) -> list[str]:
    """world.sbatch_lines that would change what rlrun relies on (its output file, its signal)."""
    return [line for line in lines if line.strip().split("=", 1)[0].split(" ", 1)[0] in OWN_OPTIONS]


def config_problems(world: WorldConfig, tensor_parallel_size: int) -> list[str]:
    """What SLURM's rules say of a world=slurm config, one sentence each (asked by preflight): each
    option line, each role's GPUs on a node (a vLLM server's `tensor_parallel_size` workers among
    them), the time limit, the signal's lead before it, options that would undo rlrun's own. (Each
    key's own range: rlrun/config/bounds.py.)"""
    w = world
    problems = Problems()
    need = problems.need
    for key, lines in (("world.sbatch_lines", w.sbatch_lines), ("world.srun_args", w.srun_args)):
        for line in lines:
            need(
                str(line).startswith("-") and "\n" not in str(line),
                f"{key}: {line!r} is not one sbatch/srun option (e.g. --qos=high): give each option as one item starting with '-'.",
            )
    for role in ("redis", "vllm", "trainer", "actor"):
        place = getattr(w, role)
        need(
            float(place.gpus).is_integer(),
            f"world.{role}.gpus must be a whole number of GPUs under world=slurm (got {place.gpus}).",
        )
        need(
            place.local or place.gpus <= w.gpus_per_node,
            f"world.{role}.gpus={place.gpus:g} is more than a node has (world.gpus_per_node={w.gpus_per_node}).",
        )
    tp = tensor_parallel_size
    need(
        w.vllm.gpus == 0 or w.vllm.gpus >= tp,
        f"world.vllm.gpus={w.vllm.gpus:g} is fewer than inference.tensor_parallel_size={tp}: each server runs one "
        f"worker per GPU; set world.vllm.gpus={tp}.",
    )
    limit = time_limit_s(world.time)
    if limit is None:
        problems.append(
            f"world.time={world.time!r} is not a SLURM time limit: use MM, HH:MM:SS or D-HH:MM:SS (e.g. 24:00:00)."
        )
    elif world.signal_lead_s >= limit:
        problems.append(
            f"world.signal_lead_s={world.signal_lead_s} is not shorter than world.time={world.time} ({limit} s): the job would be "
            "signalled to stop as it starts. Shorten the lead or lengthen the time."
        )
    own = own_option_problems(world.sbatch_lines)
    if own:
        problems.append(
            f"world.sbatch_lines {own} change what rlrun sets itself (the job's output file under the run directory, the "
            "signal before the time limit, requeueing): remove them; world.signal_lead_s and world.requeue set the last two."
        )
    return problems


# --- the job's life ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobEnv:
    """What SLURM tells the batch step about its job."""

    job_id: str
    restarts: int  # SLURM_RESTART_COUNT: 0 for the first start, n after n requeues
    nodelist: str  # SLURM_JOB_NODELIST, compressed ("node[1-4]")
    cpus_per_node: str  # SLURM_JOB_CPUS_PER_NODE ("72(x4)")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Optional["JobEnv"]:
        """The allocation this process runs in; None outside one."""
        job = env.get("SLURM_JOB_ID")
        if not job:
            return None
        return cls(
            job,
            int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            env.get("SLURM_JOB_NODELIST", ""),
            env.get("SLURM_JOB_CPUS_PER_NODE", ""),
        )


def starts_without_progress(steps_at_start: list[int], step_now: int) -> int:
    """How many starts in a row, the latest included, ended where they began: `steps_at_start`
    holds the checkpoint step each start of the job found, oldest first; `step_now` the one
    there is now."""
    count = 0
    for step in reversed(steps_at_start):
        if step != step_now:
            break
        count += 1
    return count


def no_progress_message(count: int, step: int, job_id: str) -> str:
    return (
        f"SLURM job {job_id} started {count} times in a row without a new checkpoint (still step {step}), so it is "
        f"not requeued again (world.max_starts_without_progress). Look at the last launch's logs (`rlrun logs RUN`): "
        f"a time limit too short to reach a checkpoint (raise world.time, or lower trainer.checkpoint_every), or a "
        f"process that fails at every start. Then continue with `rlrun resume RUN`."
    )


def cancel_reason(output: str, job_id: str) -> Optional[str]:
    """Why SLURM last stopped job `job_id`, from slurmstepd's line in the job's output: '' for a
    plain scancel, 'PREEMPTION', 'TIME LIMIT', ...; None when no such line is there."""
    found = [m.group(2) or "" for m in _CANCELLED.finditer(output) if m.group(1) == job_id]
    return found[-1] if found else None


def stop_status(reason: Optional[str]) -> str:
    """The run's status after SLURM stopped it for `reason` (cancel_reason's)."""
    if reason is None:
        return "terminated"  # a SIGTERM from elsewhere
    return STOP_STATUS.get(reason, reason.lower())


@dataclass(frozen=True)
class StopOutcome:
    """What became of the job after SLURM's signal stopped the run."""

    status: str  # the run's status now (state.json)
    message: str  # one paragraph for the job's output
    requeued: bool
    no_progress: bool = False  # not requeued: its starts made no progress (a requeue loop)


def steps_at_starts(run_dir: RunDir, job_id: str) -> list[int]:
    """The checkpoint step each start of job `job_id` found, oldest first (events.jsonl)."""
    return [
        int(e.get("checkpoint_step", 0))
        for e in read_jsonl(run_dir.events)
        if e.get("event") == "slurm_job_started" and e.get("job") == job_id
    ]


def record_start(run_dir: RunDir, job: JobEnv, world: WorldConfig, step_now: int) -> None:
    """Note this start of the job; RestartsExhausted (the job ends) when its earlier starts ended
    where they began world.max_starts_without_progress times in a row: SLURM requeued it (a node
    failure, a preemption) into a loop. A first start (a new job) is never refused."""
    from rlrun.supervisor.events import EventLog

    events = EventLog(run_dir.events)
    stuck = starts_without_progress(steps_at_starts(run_dir, job.job_id), step_now)
    if job.restarts > 0 and stuck >= world.max_starts_without_progress:
        message = no_progress_message(stuck, step_now, job.job_id)
        run_dir.write_state(status="stopped: no progress", slurm_job_id=job.job_id)
        events.emit(
            "slurm_job_stopped",
            job=job.job_id,
            signal=None,
            reason="no progress",
            checkpoint_step=step_now,
            action="stop",
        )
        raise RestartsExhausted(message, process="slurm job")
    events.emit("slurm_job_started", job=job.job_id, restart=job.restarts, checkpoint_step=step_now)
    run_dir.write_state(slurm_job_id=job.job_id)


def after_stop(
    run_dir: RunDir, job: JobEnv, world: WorldConfig, signal_name: str, step_now: int, requeue_job=None
) -> StopOutcome:
    """The run has stopped in order on SLURM's signal `signal_name` (USR1: the time limit nears;
    TERM: scancel, preemption, the limit itself; INT: Ctrl-C in salloc): requeue the job when its
    time ran out and this start made progress (or the ones before it, up to the limit), and say so
    in the run's state and events."""
    from rlrun.supervisor.events import EventLog

    requeue_job = requeue_job or requeue
    reason = "TIME LIMIT" if signal_name == TIME_LIMIT_SIGNAL else None
    if signal_name == "TERM":
        try:
            reason = cancel_reason(run_dir.slurm_output(job.job_id).read_text(errors="replace"), job.job_id)
        except OSError:
            reason = None
    requeued, no_progress = False, False
    if reason == "TIME LIMIT":
        stuck = starts_without_progress(steps_at_starts(run_dir, job.job_id), step_now)
        if not world.requeue:
            status, message = (
                "stopped at the time limit",
                f"SLURM job {job.job_id} reached its time limit at step {step_now}; world.requeue=false: `rlrun resume RUN` submits it again.",
            )
        elif stuck >= world.max_starts_without_progress:
            status, message, no_progress = (
                "stopped: no progress",
                no_progress_message(stuck, step_now, job.job_id),
                True,
            )
        else:
            try:
                requeue_job(job.job_id)
                requeued = True
                status, message = (
                    "requeued",
                    f"SLURM job {job.job_id} requeued itself before its time limit; its next start continues from step {step_now}.",
                )
            except EnvironmentProblem as exc:  # not a batch job (salloc), or the controller said no
                status, message = (
                    "stopped at the time limit",
                    f"{exc}. `rlrun resume RUN` continues the run (from step {step_now}).",
                )
    elif signal_name == "INT":
        status, message = (
            "interrupted",
            "interrupted: every process of the run was stopped. `rlrun resume RUN` continues it.",
        )
    else:
        status = stop_status(reason)
        message = (
            f"SLURM stopped job {job.job_id} ({status}) at checkpoint step {step_now}; every process was stopped in order. "
            + (
                "SLURM starts it again if it requeues preempted jobs; else `rlrun resume RUN` submits it again."
                if status == "preempted"
                else "`rlrun resume RUN` submits it again."
            )
        )
    run_dir.write_state(status=status, slurm_job_id=job.job_id)
    EventLog(run_dir.events).emit(
        "slurm_job_stopped",
        job=job.job_id,
        signal=signal_name,
        reason=reason,
        checkpoint_step=step_now,
        action="requeue" if requeued else "stop",
    )
    return StopOutcome(status, message, requeued, no_progress)


# --- edges: the SLURM commands ----------------------------------------------------------------


def _run(argv: list[str], what: str, timeout: float = 30.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise EnvironmentProblem(
            f"{what} needs SLURM's `{argv[0]}`, which is not on PATH: run rlrun where SLURM's commands are."
        ) from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(
            f"`{' '.join(argv[:3])} ...` did not answer within {timeout:g} s: is slurmctld reachable?"
        ) from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().replace("\n", " ")
        raise EnvironmentProblem(f"{what}: `{shlex.join(argv)}` failed (exit {done.returncode}): {message}")
    return done.stdout


def submit(script: Path) -> str:
    """sbatch the script; its job id."""
    out = _run(["sbatch", "--parsable", str(script)], "submitting the run")
    job = out.strip().split(";", 1)[0]
    if not job.isdigit():
        raise EnvironmentProblem(f"sbatch answered {out.strip()!r}, not a job id.")
    return job


def requeue(job_id: str) -> None:
    _run(["scontrol", "requeue", job_id], f"requeueing job {job_id}")


def queue_state(job_id: str) -> Optional[str]:
    """The job's state in SLURM's queue (PENDING, RUNNING, COMPLETING, ...); None once SLURM has
    forgotten it or cannot be asked."""
    try:
        done = subprocess.run(
            ["squeue", "--noheader", "--jobs", job_id, "--format=%T"], capture_output=True, text=True, timeout=15
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = done.stdout.strip().splitlines()
    return state[0].strip() if done.returncode == 0 and state else None


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list ('node[1-3],gpu7') → names, as scontrol expands it."""
    return _run(["scontrol", "show", "hostnames", nodelist], "reading the allocation's nodes").split()


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's address (NodeAddr), where processes on other nodes reach its servers."""
    from rlrun.cluster.slurm_plan import node_addresses as parse

    found = parse(_run(["scontrol", "show", "node", ",".join(names)], "reading the allocation's node addresses"))
    return {name: found.get(name, name) for name in names}


def in_allocation(env: Mapping[str, str] = os.environ) -> bool:
    return JobEnv.from_env(env) is not None
