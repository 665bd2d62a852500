"""What a signal means to a running `rlrun train` or `rlrun resume`. Anywhere, SIGTERM stops the run
in order, as Ctrl-C does. In a SLURM job (world=slurm) the signal before the time limit does too;
the job then requeues itself if its starts make progress, and the run's state and events say what
became of the job. The CLI installs the handlers (library code never does) and asks this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from rlrun.cluster import slurm_job
from rlrun.errors import RestartsExhausted
from rlrun.run.built import BuiltRun
from rlrun.rundir import RunDir


@dataclass
class StopSignals:
    built: BuiltRun
    run_dir: RunDir
    job: Optional[slurm_job.JobEnv]  # the SLURM job the run is in (world=slurm), else None
    received: list[str] = field(default_factory=list)  # signal names without "SIG", in order
    said_at_signal: Optional[slurm_job.StopOutcome] = None

    @classmethod
    def of(cls, built: BuiltRun, run_dir: RunDir, environ: Mapping[str, str]) -> "StopSignals":
        job = slurm_job.JobEnv.from_env(environ) if built.cfg.world.kind == "slurm" else None
        return cls(built, run_dir, job)

    @property
    def names(self) -> tuple[str, ...]:
        """The signals that stop the run (names without "SIG")."""
        return ("TERM",) if self.job is None else ("TERM", slurm_job.TIME_LIMIT_SIGNAL)

    def started(self) -> None:
        """In a SLURM job: this start recorded; RestartsExhausted when its requeues loop without progress."""
        if self.job is not None:
            slurm_job.record_start(self.run_dir, self.job, self.built.cfg.world, self.checkpoint_step())

    def received_signal(self, name: str) -> bool:
        """Note signal `name`; True for the first, which starts the orderly stop (later ones must
        not cut it short)."""
        self.received.append(name)
        if len(self.received) > 1:
            return False
        if self.job is not None and name == "TERM":
            # SLURM is ending the job (scancel, preemption, the limit): it has signalled every process
            # and kills what is left, rlrun included, KillWait later. Say so now, then stop in order.
            self.said_at_signal = self._after_stop("TERM")
        return True

    def after_stop(self) -> slurm_job.StopOutcome:
        """In a SLURM job, once the run has stopped in order: what became of the job (requeued or
        not), written in the run's state. RestartsExhausted when its starts made no progress."""
        if self.said_at_signal is not None:  # the orderly stop wrote "interrupted" over it since
            outcome = self.said_at_signal
            self.run_dir.write_state(status=outcome.status)
        else:
            outcome = self._after_stop(self.received[0] if self.received else "INT")
        if outcome.no_progress:
            raise RestartsExhausted(outcome.message, process="slurm job") from None
        return outcome

    def checkpoint_step(self) -> int:
        """The step a restart of the trainer would resume from (0: none yet), by its backend's rule."""
        usable = [c.step for c in self.built.backend.layout.candidates(self.run_dir) if c.skipped_because is None]
        return max(usable, default=0)

    def _after_stop(self, signal_name: str) -> slurm_job.StopOutcome:
        assert self.job is not None  # called in a SLURM job only
        return slurm_job.after_stop(self.run_dir, self.job, self.built.cfg.world, signal_name, self.checkpoint_step())
