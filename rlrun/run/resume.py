"""`rlrun resume RUN_DIR`: continue a stopped or crashed run from what its directory holds.

The saved resolved config is reloaded (never recomposed from conf/: later edits to recipes cannot
change a resumed run), changed only by the allow-listed overrides; then `rlrun train`'s path runs
(docs/recovery.md: what each role restarts from).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import yaml

from rlrun.config.compose import config_from_data, override_resolved
from rlrun.errors import ConfigError, RunDirError
from rlrun.run import preflight, runlock
from rlrun.run.built import BuiltRun, build
from rlrun.rundir import RunDir, write_atomic

# What a resumed run may change: how long it trains, how it is supervised and where its processes
# run (a SLURM job's time, nodes, partition...). Everything else
# (model, data, algorithm, batch shape) would make the checkpoint and the journal mean something
# else.
ALLOWED_OVERRIDES = (
    "trainer.max_train_steps",
    "trainer.checkpoint_every",
    "trainer.keep_checkpoints",
    "supervisor.*",
    "inference.ready_timeout_s",
    "metrics.*",
    "world.*",
)


@dataclass(frozen=True)
class ResumePlan:
    run_dir: RunDir
    built: BuiltRun  # the run of the config it would have
    resolved_yaml: str
    changes: list[tuple[str, object, object]]  # (key, before, after)
    already_finished: bool
    overrides_yaml: str  # overrides.yaml with this resume's changes added
    fresh: bool = False  # submitted (`rlrun submit`) and never started: its first start


def owned(root) -> runlock.RunLock:
    """The run at `root` owned by this process (a `with` block), before anything of it is read;
    RunDirError (exit 4) at once when it is not a run or another process runs it."""
    run_dir = RunDir(root)
    run_dir.require_run()
    return runlock.acquire(run_dir)


def plan_resume(root, overrides: list[str]) -> ResumePlan:
    """What resuming `root` with `overrides` means, every check (preflight's included) run on the
    config it would have: until `apply`, nothing of the run has changed. The caller owns the run
    (`owned`)."""
    run_dir = RunDir(root)
    run_dir.require_run()
    if not run_dir.config.is_file():
        raise RunDirError(f"{run_dir.root} has no saved config ({run_dir.config.name}); it cannot be resumed.")
    saved = run_dir.read_yaml(run_dir.config, what="the run's resolved config")
    if not isinstance(saved, dict):
        raise RunDirError(
            f"{run_dir.config}, the run's resolved config, is damaged: it holds {type(saved).__name__}, not a mapping "
            f"of sections. Restore it from a copy (every role file, {run_dir.roles}/<name>.yaml, holds one under `config:`)."
        )
    new, changes = override_resolved(saved, overrides)
    for key, _before, _after in changes:
        if not any(fnmatch.fnmatchcase(key, pattern) for pattern in ALLOWED_OVERRIDES):
            raise ConfigError(
                f"'{key}' cannot be changed when resuming: it would change what the checkpoint and the journal "
                f"mean. Allowed: {', '.join(ALLOWED_OVERRIDES)}. Start a new run with `rlrun train` instead."
            )
    try:
        cfg = config_from_data(new, source=str(run_dir.config))
    except ConfigError as exc:
        raise ConfigError(f"{run_dir.config} (with the overrides given): {exc}") from None
    state = run_dir.read_state()
    fresh = state.get("status") == "submitted" and not run_dir.launches()
    has_data = any(run_dir.redis_dir.rglob("*.aof")) or any(run_dir.redis_dir.rglob("*.rdb"))
    if cfg.streams.url is None and not has_data and not fresh:
        raise RunDirError(
            f"{run_dir.root} has no Redis data ({run_dir.redis_dir} holds no AOF): the token journal and the "
            f"trainer's pending groups are gone, so the run cannot be resumed exactly. Start a new run."
        )
    more_steps = any(k == "trainer.max_train_steps" for k, _, _ in changes)
    finished = state.get("status") == "finished" and not more_steps
    history = (
        run_dir.read_yaml(run_dir.overrides, what="the overrides that made the run")
        if run_dir.overrides.is_file()
        else []
    )
    if not isinstance(history, list):
        raise RunDirError(
            f"{run_dir.overrides} is damaged: it holds {type(history).__name__}, not a list of overrides. Restore it, or write [] into it."
        )
    built = build(cfg)
    if not finished:
        preflight.check(built, run_dir.root, fresh=False)  # packages, model, data, binary, ports, checkpoints
    history = history + [f"resume: {k}={v}" for k, _, v in changes]
    return ResumePlan(
        run_dir, built, yaml.safe_dump(new, sort_keys=False), changes, finished, yaml.safe_dump(history), fresh
    )


def apply(plan: ResumePlan) -> None:
    """Save the (possibly changed) config and note the resume in the run's overrides (each file
    replaced whole: a crash leaves the old one or the new one)."""
    if plan.changes:
        write_atomic(plan.run_dir.config, plan.resolved_yaml)
        write_atomic(plan.run_dir.overrides, plan.overrides_yaml)


# What squeue shows of a job that has ended (until SLURM forgets it, MinJobAge later).
ENDED_JOB_STATES = {
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


def check_job_gone(run_dir: RunDir) -> None:
    """RunDirError while the run's SLURM job is still queued, running or ending: a second job on
    the same run directory would run it twice."""
    from rlrun.cluster import slurm_job

    job = run_dir.read_state().get("slurm_job_id")
    state = slurm_job.queue_state(str(job)) if job else None
    if state is not None and state not in ENDED_JOB_STATES:
        raise RunDirError(
            f"{run_dir.root} is SLURM job {job}'s, which is {state} now: it continues the run by itself. Wait for it to "
            f"end, or `scancel {job}` first, then `rlrun resume {run_dir.root}` submits it again."
        )
