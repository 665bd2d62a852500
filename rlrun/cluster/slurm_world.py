"""world=slurm: the run's process specs as srun steps of the SLURM job rlrun runs in (docs/cluster.md).

    spawner = SlurmSpawner(slurm_plan.plan(...), job_id, run_dir.slurm_steps)
    Supervisor(specs, events, spawner=spawner)   # same restart policy, completion rule, journal

Owns: starting a placed process as `srun --overlap ... python -m rlrun.entrypoints.slurm_step -- ARGV`
on its planned nodes (one task per node), waiting for the step's record of its pid, and signalling
the step through SLURM (`scancel --signal`): a step's every process, on every node, gets it. A
process beside the supervisor (`world.<role>.local`, Redis by default) starts through the local
spawner in the batch step. Refuses: restart decisions (the supervisor's), secrets on a command line
(they reach the step through srun's environment, read here from their 0600 files).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from rlrun.cluster import slurm_plan, slurm_step
from rlrun.errors import EnvironmentProblem
from rlrun.supervisor.local import Handle, LocalSpawner, Spawner
from rlrun.supervisor.spec import ProcessSpec

log = logging.getLogger(__name__)

SIGNAL_NAMES: dict[int, str] = {
    signal.SIGTERM: "TERM",
    signal.SIGKILL: "KILL",
    signal.SIGINT: "INT",
    signal.SIGUSR1: "USR1",
    signal.SIGUSR2: "USR2",
}


class SlurmStepHandle:
    """One srun step as the supervisor sees a process: `pid` is the step's first task's (it leads
    its process group on its node, as a locally started process's guard does). Its exit status is
    what the step's tasks wrote as they ended (slurm_step.py; negative for a signal), as torchrun
    reads ranks: the first failure, or 0 once every node's exited 0; else srun's own, once srun
    exits (128 + N for a task killed by signal N), which during a job's end is only at KillWait."""

    def __init__(self, srun: subprocess.Popen, job_id: str, record: Path, name: str, nodes: int = 1) -> None:
        self._srun, self._job, self._record, self._name, self._nodes = srun, job_id, record, name, nodes
        self.pid = srun.pid  # until the step records its own
        self.step: Optional[str] = None  # "JOB.STEP" once recorded
        self.node: Optional[str] = None

    def read_record(self) -> bool:
        try:
            data = json.loads(self._record.read_text())
        except (OSError, ValueError):
            return False
        self.pid, self.node = int(data["pid"]), data.get("node")
        self.step = f"{data.get('job') or self._job}.{data['step']}" if data.get("step") is not None else None
        return True

    def poll(self) -> Optional[int]:
        from rlrun.trainer.rank_group import first_failure

        codes: list[int | None] = []
        for rank in range(self._nodes):
            try:
                codes.append(int(slurm_step.exit_file(self._record, rank).read_text()))
            except (OSError, ValueError):
                codes.append(None)
        failed = first_failure(codes)
        if failed is not None:
            return failed
        if all(code == 0 for code in codes):
            return 0
        return self._srun.poll()

    def signal_group(self, sig: int) -> None:
        if self._srun.poll() is not None:
            return
        if self.step is not None and sig in SIGNAL_NAMES:
            subprocess.run(
                ["scancel", "--quiet", f"--signal={SIGNAL_NAMES[sig]}", self.step], capture_output=True, timeout=30
            )
            if sig != signal.SIGKILL:
                return  # (a step of a job SLURM is cancelling refuses it: SLURM signals it itself)
        # A kill, or no step yet (srun still creating it): srun's own termination of its step
        # (SIGTERM to srun: "forcing job termination"), after which srun exits.
        self._srun.send_signal(signal.SIGTERM)

    def descendants(self, fresh: bool = False) -> list[int]:
        return []  # SLURM tracks the step's processes, on their nodes, and kills them with it


class SlurmSpawner:
    def __init__(
        self,
        plan: slurm_plan.Plan,
        job_id: str,
        steps_dir: Path,
        *,
        srun_args: Sequence[str] = (),
        start_timeout_s: float = 120.0,
        local: Optional[Spawner] = None,
        python: str = sys.executable,
    ) -> None:
        self._plan, self._job, self._steps = plan, job_id, Path(steps_dir)
        self._srun_args, self._timeout, self._python = list(srun_args), start_timeout_s, python
        self._local = local or LocalSpawner()

    def spawn(self, spec: ProcessSpec) -> Handle:
        placed = self._plan.placed.get(spec.name)
        if placed is None:
            raise ValueError(f"process {spec.name!r} is not in this run's plan ({', '.join(self._plan.placed)})")
        if placed.local:
            return self._local.spawn(spec)
        self._steps.mkdir(parents=True, exist_ok=True)
        record = self._steps / f"{spec.name}.{uuid.uuid4().hex[:8]}.json"
        argv = slurm_plan.srun_argv(
            self._plan,
            spec.name,
            list(spec.argv),
            job_id=self._job,
            record=record,
            log=spec.log_path.resolve(),
            srun_args=self._srun_args,
            python=self._python,
        )
        env = {**os.environ, **spec.env}
        env.update({name: path.read_text().strip() for name, path in spec.secret_env.items()})
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab", buffering=0) as log_file:
            srun = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=spec.cwd,
                env=env,
                start_new_session=True,
            )
        handle = SlurmStepHandle(srun, self._job, record, spec.name, nodes=len(placed.shares))
        deadline = time.monotonic() + self._timeout
        while not handle.read_record():
            if srun.poll() is not None:  # it failed before it ran: the supervisor reads its status
                return handle
            if time.monotonic() > deadline:
                srun.send_signal(signal.SIGTERM)
                srun.wait()
                raise EnvironmentProblem(
                    f"{spec.name}'s srun step did not start within world.placement_timeout_s={self._timeout:g} s on "
                    f"{', '.join(placed.nodes)} (SLURM busy, or the nodes unreachable?). Its srun output: {spec.log_path}."
                )
            time.sleep(0.05)
        log.info("%s started as step %s on %s (pid %d there)", spec.name, handle.step, handle.node, handle.pid)
        return handle

    def server_hosts(self) -> dict[str, str]:
        """A run spanning nodes: each server listens on its node's address (Redis on the supervisor's),
        which the processes on the other nodes can reach; on one node, where the config says."""
        return slurm_plan.server_hosts(self._plan)

    def close(self) -> None:
        """Nothing to release: the supervisor stopped every step, and SLURM ends the rest with the job."""
