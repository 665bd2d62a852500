"""`rlrun train` as a library call: prepare the run directory, build the plan, supervise, stop.
The CLI renders; this module decides; the trainer backend, bound once into the built run
(`rlrun.run.built`), says its processes and how its completion is judged.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

import yaml

from rlrun.cluster.gpus import GroupsSeen, end_leftovers
from rlrun.config import RunConfig
from rlrun.errors import EnvironmentProblem, ProcessFailed, RunDirError
from rlrun.parts.progress import Progress, ProgressReader
from rlrun.run import preflight, runlock
from rlrun.run.built import BuiltRun
from rlrun.run.plan import RunPlan, build_plan, gpu_plan, plan_endpoints
from rlrun.rundir import RunDir
from rlrun.streams import server as redis_server
from rlrun.supervisor import EventLog, ProcessStatus, ProgressWatch, Supervisor

log = logging.getLogger(__name__)


def run_root(cfg: RunConfig) -> Path:
    name = cfg.run.name or f"{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.run.dir).expanduser() if cfg.run.dir else Path(cfg.run.runs_root) / name


def outside_allocation(cfg: RunConfig) -> bool:
    """world=slurm, but not inside a SLURM job: the run goes to SLURM as a batch job."""
    from rlrun.cluster import slurm_job

    return cfg.world.kind == "slurm" and not slurm_job.in_allocation()


def refuse_outside_allocation(built: BuiltRun) -> None:
    """`rlrun train` of world=slurm starts inside a SLURM job; outside one, EnvironmentProblem naming
    `rlrun submit`, after any setting to fix (exit 2 is said before where to run it, exit 3)."""
    if outside_allocation(built.cfg):
        preflight.check_settings(built)
        raise EnvironmentProblem(
            "world=slurm runs inside a SLURM job: `rlrun submit ...` (same arguments) submits it as a batch job, "
            "or start `rlrun train` within `salloc`."
        )


@contextmanager
def new_run(built: BuiltRun, resolved_yaml: str, overrides: list[str], root: Optional[Path] = None) -> Iterator[RunDir]:
    """Create the run directory and own it (rlrun/run/runlock.py) until the block ends: a second
    `rlrun train` into the same new directory, or a resume of it, is refused meanwhile."""
    cfg = built.cfg
    run_dir = RunDir((root or run_root(cfg)).resolve())
    preflight.check(built, run_dir.root, fresh=True)  # a run that cannot work leaves no trace
    gpu_plan(built)  # nor one asking for more GPUs than this machine shows
    try:
        run_dir.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise RunDirError(
            f"cannot create the run directory {run_dir.root}: {exc.strerror}. Choose a writable location with run.dir=PATH."
        ) from None
    with runlock.acquire(run_dir):
        run_dir.create(
            {"kind": "rlrun-run", "recipe": cfg.recipe, "created": time.time(), "overrides": overrides}
        )  # checks again, owned
        run_dir.config.write_text(resolved_yaml)
        run_dir.overrides.write_text(yaml.safe_dump(list(overrides)))
        run_dir.write_state(status="created")
        yield run_dir


def create_run(built: BuiltRun, resolved_yaml: str, overrides: list[str], root: Optional[Path] = None) -> RunDir:
    """A new run directory, created and let go (for those that start it later)."""
    with new_run(built, resolved_yaml, overrides, root) as run_dir:
        return run_dir


def preview(built: BuiltRun) -> RunPlan:
    """`--dry-run`: what `train` would refuse, refused now (the cheap checks), and the plan it would
    start, built in the run directory it would create; nothing is created or started."""
    run_dir = RunDir(run_root(built.cfg))
    preflight.check(built, run_dir.root, fresh=True, cheap=True)
    return build_plan(built, run_dir, preview=True)


PORT_ATTEMPTS = 3  # a service losing its port to another process at start gets new ports


def train(
    built: BuiltRun,
    run_dir: RunDir,
    on_tick: Optional[Callable[[list[ProcessStatus], Progress], None]] = None,
    resumed: bool = False,
) -> str:
    """Run the whole job, fresh or resumed (every role recovers from the run directory and Redis);
    return why it finished. Raises ProcessFailed / KeyboardInterrupt. The caller owns the run and
    has run the preflight (`new_run`, `resume.plan_resume`)."""
    cfg, backend = built.cfg, built.backend
    run_dir = run_dir.for_new_launch()  # logs/launch-<n>/: each train/resume keeps its own logs
    if cfg.streams.url is not None:
        _use_external_redis(cfg, run_dir)
    plan = build_plan(built, run_dir)  # the model built, the GPUs placed: started as planned
    path = plan.model_path
    run_dir.ensure_secret(run_dir.vllm_api_key)
    if not run_dir.current_weights.exists():
        run_dir.point_current_weights(Path(path))  # vLLM starts from the base model
    events = EventLog(run_dir.events, clock=time.time)
    if resumed:
        events.emit("run_resumed", previous_status=run_dir.read_state().get("status"), launch=run_dir.launch)
    else:
        events.emit("run_started", launch=run_dir.launch)  # where the run's wall time begins (rlrun/telemetry/ettr.py)
    run_dir.write_state(
        status="running", supervisor_pid=os.getpid(), started_at=time.time(), model_path=path, launch=run_dir.launch
    )
    status = "failed"
    supervisor: Optional[Supervisor] = None
    spawner = None
    progress: Optional[ProgressReader] = None
    try:
        spawner = built.world.spawner(run_dir)  # one per launch: a retry keeps its placement
        gpus = plan.gpus  # this machine's, at every launch (a resume may run on another)
        if gpus.on_gpus:
            spawner = GroupsSeen(spawner)  # its groups: what of the run may hold a GPU after the stop
        if gpus.on_gpus:  # what `rlrun status` shows beside each process
            events.emit(
                "gpus_placed", source=gpus.visible.source, gpus={name: list(ids) for name, ids in gpus.gpus.items()}
            )
        for attempt in range(1, PORT_ATTEMPTS + 1):
            # Ports are picked free, but another program may bind one before our server does:
            # such a start is retried on fresh ports (nothing depends on the old ones yet).
            endpoints = plan_endpoints(built, redis_server.pick_free_port, spawner.server_hosts())
            if endpoints.redis_port is not None:
                redis_server.write_server_config(
                    run_dir,
                    endpoints.redis_port,
                    endpoints.host("redis", cfg.streams.host),
                    cfg.streams.appendfsync,
                    default_user=backend.redis_default_user(),
                )
            progress = ProgressReader(
                endpoints.redis_url,
                run_dir,
                events,
                num_actors=cfg.actor.num_actors,
                max_train_steps=cfg.trainer.max_train_steps,
            )
            tick = None
            if on_tick is not None:
                tick = lambda processes, progress=progress: on_tick(processes, progress.read())  # noqa: E731
            supervisor = Supervisor(
                plan.specs_on(endpoints, events),
                events,
                spawner=spawner,
                poll_interval_s=cfg.supervisor.poll_interval_s,
                on_tick=tick,
                diagnose=diagnoser_for(cfg, run_dir),
            )
            try:
                supervisor.start_all()
                break
            except ProcessFailed as exc:
                if attempt == PORT_ATTEMPTS or "address already in use" not in exc.log_tail.lower():
                    raise
                events.emit("port_taken", process=exc.process, attempt=attempt)
                supervisor.stop_all()
        assert supervisor is not None and progress is not None  # the loop above breaks once they started, or raises
        reason = supervisor.watch(backend.completion_check(progress), progress_watch(built, run_dir, progress))
        status = "finished"
        return reason
    except KeyboardInterrupt:
        status = "interrupted"
        events.emit("interrupted")
        raise
    finally:
        if supervisor is not None:
            supervisor.stop_all()
            if on_tick and progress is not None:
                on_tick(supervisor.processes, progress.read())
        if isinstance(spawner, GroupsSeen):  # nothing of the run left on its GPUs
            end_leftovers(gpus, spawner.groups, events.emit)
        if spawner is not None:
            spawner.close()  # world=ray: the agents and the placement group go
        run_dir.write_state(status=status, stopped_at=time.time())
        events.emit("run_stopped", status=status, malformed_events=progress.malformed_events if progress else 0)


def progress_watch(built: BuiltRun, run_dir: RunDir, progress: ProgressReader) -> ProgressWatch:
    """The run's progress is the trainer's step: none for supervisor.progress_timeout_s while every
    process is alive is a stall of the run; what each process waits for goes to diagnostics/, then
    the trainer and the actors are dumped and restarted (rlrun/supervisor/stall.py)."""
    from rlrun.streams.names import actor_name
    from rlrun.supervisor.diagnostics import write_report

    cfg = built.cfg
    k_all = cfg.actor.num_actors
    return ProgressWatch(
        marker=lambda: progress.read().step,
        timeout_s=cfg.supervisor.progress_timeout_s,
        suspects=("trainer", *(actor_name(k, k_all) for k in range(k_all))),
        report=lambda why: write_report(
            run_dir.diagnostics, "run-stalled", why, progress.stall_state(built.backend.trainer_view)
        ),
        setting="supervisor.progress_timeout_s",
    )


def diagnoser_for(cfg: RunConfig, run_dir: RunDir):
    """Stack dumps before kills (local processes only: under Ray the pids live on other nodes)."""
    if cfg.supervisor.dump_timeout_s <= 0 or cfg.world.kind != "local":
        return None
    from rlrun.supervisor.diagnostics import Diagnoser

    return Diagnoser(run_dir.diagnostics, budget_s=cfg.supervisor.dump_timeout_s).capture


def _use_external_redis(cfg: RunConfig, run_dir: RunDir) -> None:
    """Claim the external Redis's database for this run and put its password (if any) where the
    run's processes read it (0600, under secrets/)."""
    from rlrun.streams import external

    assert cfg.streams.url is not None  # called only then
    password = external.read_password(cfg.streams.password_file)
    external.check_and_claim(cfg.streams.url, password, str(run_dir.root.resolve()), claim=True)
    if password is not None:
        run_dir.secrets.mkdir(parents=True, exist_ok=True, mode=0o700)
        run_dir.write_secret(run_dir.redis_password, password)
    elif run_dir.redis_password.exists():
        run_dir.redis_password.unlink()  # none now: an old one would be sent to a server that wants none


def submit(built: BuiltRun, resolved_yaml: str, overrides: list[str]) -> tuple[RunDir, str]:
    """`rlrun submit`: create the run directory (as `train` does, after the same checks), write its
    batch script and sbatch it; (run directory, job id). A refused submission leaves no run behind."""
    root = run_root(built.cfg).resolve()
    existed = root.exists()
    run_dir = create_run(built, resolved_yaml, overrides, root=root)
    try:
        job = submit_job(built.cfg, run_dir)
    except BaseException:
        if existed:  # an empty folder the user gave: emptied again
            for child in run_dir.root.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        else:
            shutil.rmtree(run_dir.root, ignore_errors=True)
        raise
    return run_dir, job


def submit_job(cfg: RunConfig, run_dir: RunDir) -> str:
    """Write the run's batch script (`<run>/slurm/job.sbatch`) from its config and sbatch it; the job
    id, recorded in state.json and events.jsonl. Each start of the job is `rlrun resume RUN`."""
    from rlrun.cluster import slurm_job

    run_dir.slurm.mkdir(parents=True, exist_ok=True)
    script = run_dir.slurm / "job.sbatch"
    output = run_dir.slurm / "job-%j.out"
    script.write_text(
        slurm_job.batch_script(cfg.world, run_dir.root, f"rlrun-{run_dir.root.name}", sys.executable, output)
    )
    job = slurm_job.submit(script)
    run_dir.write_state(status="submitted", slurm_job_id=job, submitted_at=time.time())
    EventLog(run_dir.events, clock=time.time).emit("slurm_submitted", job=job, script=str(script))
    return job
