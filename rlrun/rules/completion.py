"""When is training really finished? One pure rule per trainer backend: what the supervisor
observed of the trainer in, a `Verdict` (and why, for the log) out. No processes, Redis or torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainerObservation:
    samples_processed: int  # samples the trainer has consumed so far
    trainer_exit_code: int | None  # None while the trainer is running
    training_done: bool  # hf: the trainer's state says training_done (`names.training_done`)
    last_step: int  # last completed optimizer step the trainer reported
    training_finished_seen: bool = False  # fast_llm: `training_finished` seen on its events stream
    last_checkpoint_step: int | None = None  # fast_llm: step of the last complete (`ok`) checkpoint
    last_weights_ready_step: int | None = None  # fast_llm: step of the last `weights_ready` event


@dataclass(frozen=True)
class HfTarget:
    max_train_steps: int  # optimizer steps the run must take
    samples_per_step: int  # samples per optimizer step (`TrainerConfig.samples_per_step`, defined there only)

    @property
    def samples_target(self) -> int:
        """Samples the trainer consumes over the whole run."""
        return self.max_train_steps * self.samples_per_step


@dataclass(frozen=True)
class Verdict:
    finished: bool  # training reached its end and the trainer stopped cleanly
    reason: str  # one line for the log, saying why


def _not_exited_cleanly(obs: TrainerObservation) -> Verdict | None:
    if obs.trainer_exit_code is None:
        return Verdict(False, f"trainer still running (last step {obs.last_step})")
    if obs.trainer_exit_code != 0:
        code, step = obs.trainer_exit_code, obs.last_step
        return Verdict(False, f"trainer exited with code {code} (last step {step})")
    return None


def hf_finished(target: HfTarget, obs: TrainerObservation) -> Verdict:
    """hf: the trainer exited 0 **and** consumed the samples target or said `training_done`. Exit 0
    is needed either way: still running, it may be saving its last checkpoint; a crash is a crash."""
    early = _not_exited_cleanly(obs)
    if early is not None:
        return early
    n, goal = obs.samples_processed, target.samples_target
    if n >= goal:
        return Verdict(True, f"trainer exited 0 after {n} of {goal} samples")
    if obs.training_done:
        return Verdict(True, f"trainer exited 0 after training_done ({n} of {goal} samples)")
    return Verdict(False, f"trainer exited 0 after {n} of {goal} samples, without training_done")


def fast_llm_finished(train_iters: int, obs: TrainerObservation) -> Verdict:
    """fast_llm: `training_finished` **and** exit 0 **and** the last complete checkpoint or
    `weights_ready` step at or past `train_iters`. No sample count (Fast-LLM overshoots
    docs_per_step); `training_finished` alone proves nothing (it is also sent after SIGTERM)."""
    early = _not_exited_cleanly(obs)
    if early is not None:
        return early
    if not obs.training_finished_seen:
        return Verdict(False, "trainer exited 0 without a training_finished event")
    steps = [s for s in (obs.last_checkpoint_step, obs.last_weights_ready_step) if s is not None]
    if any(s >= train_iters for s in steps):
        return Verdict(True, f"training_finished at step {max(steps)} of {train_iters} and exit 0")
    reached = max(steps) if steps else obs.last_step
    return Verdict(False, f"interrupted at step {reached} of {train_iters}")
