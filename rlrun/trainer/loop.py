"""The hf trainer's optimizer loop (its process: `rlrun/entrypoints/trainer.py`, one per rank)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rlrun.config import RunConfig
from rlrun.config.schema import TrainerConfig
from rlrun.inference.admin import VllmAdmin
from rlrun.rundir import RunDir
from rlrun.trainer import checkpoint
from rlrun.trainer.batches import BatchReader
from rlrun.trainer.checkpoint import TrainerState
from rlrun.trainer.eval_gate import EvalGate
from rlrun.trainer.parallel import Parallel, Ranks
from rlrun.trainer.published_state import StatePublisher
from rlrun.trainer.recorder import StepRecorder
from rlrun.trainer.step import optimizer_step
from rlrun.trainer.stopping import Stopping
from rlrun.trainer.weight_publisher import WeightPublisher

if TYPE_CHECKING:
    from rlrun.trainer.core_share import ThreadsByNeed
    from rlrun.trainer.weight_broadcast import BroadcastSync
    from rlrun.weights.shared import SharedWeights

log = logging.getLogger("rlrun.trainer")


FUSED_DEVICES = ("cpu", "cuda")  # the devices of torch's fused AdamW kernels that rlrun trains on (CPU's: torch >= 2.4)


def adamw(parameters, t: TrainerConfig):
    """The trainer's AdamW (trainer.lr, betas, weight_decay): fused, one kernel over every
    parameter, where each parameter is a floating-point tensor on a device of FUSED_DEVICES
    (FSDP2's DTensors included: tests/integration/test_trainer_ranks.py), torch's default
    otherwise (torch would refuse the fused kernel only at the first step). SmolLM2-135M's
    optimizer phase on CPU: 0.43 → 0.16 s (bench/README.md)."""
    import torch

    params = list(parameters)
    fused = all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)
    if not fused:
        log.info("AdamW not fused: a parameter is not a floating-point tensor on %s", " or ".join(FUSED_DEVICES))
    return torch.optim.AdamW(
        params, lr=t.lr, betas=(t.betas[0], t.betas[1]), weight_decay=t.weight_decay, fused=fused or None
    )


def keep_kernel(optimizer, fused: bool) -> None:
    """After a checkpoint's optimizer state is loaded: its param groups carry the `fused` of the
    optimizer that wrote it (one written before AdamW was fused: none), so this optimizer's is set
    back, with each step count where the fused kernel wants it (float32, on its parameter's device)."""
    import torch

    for group in optimizer.param_groups:
        group["fused"] = fused
        for param in group["params"] if fused else ():
            state = optimizer.state.get(param, {})
            if "step" in state:
                state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).to(param.device)


class Trainer:
    """The optimizer loop. It owns the model, the optimizer, the step's state and checkpoints, and
    composes the parts that talk to the rest of the run: `batches` (each step's groups), `weights`
    (each step's weights to vLLM), `recorder` (each step's metrics, rank 0), `published` (its state
    hash: heartbeats, progress, ready, done)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: RunDir,
        redis,
        model_path: str,
        vllm: VllmAdmin,
        parallel: Parallel | None = None,
        broadcast: "BroadcastSync | None" = None,
        stop: threading.Event | None = None,
        shared: "SharedWeights | None" = None,
        threads: "ThreadsByNeed | None" = None,
    ) -> None:
        """`stop`: set (by SIGTERM) to stop at the next step boundary with a checkpoint there.
        `broadcast`, `shared`: rank 0's way of handing weights to vLLM (None: folders). `threads`:
        torch threads set by what vLLM is doing (world.cpu_affinity=by_need; None: trainer.threads)."""
        import torch
        from transformers import AutoModelForCausalLM

        self.cfg, self.run_dir, self.vllm = cfg, run_dir, vllm
        self.model_path = model_path  # the base model's folder: its tokenizer goes into every checkpoint
        self.stopping = Stopping(redis, stop)
        self.parallel = parallel if parallel is not None else Parallel(Ranks())
        self.main = self.parallel.ranks.is_main  # rank 0 reads Redis, publishes, checkpoints' owner
        torch.manual_seed(cfg.run.seed)
        torch.set_num_threads(cfg.trainer.threads)
        self.device = torch.device(self.parallel.ranks.device(cfg.trainer.device))
        self.state = TrainerState(step=0, samples_processed=0, policy_version=0, config_hash=run_dir.config_hash())
        resume_from = checkpoint.resume_point(run_dir.checkpoints)  # damaged ones skipped, with a warning
        source = str(resume_from) if resume_from else model_path
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, cfg.model.dtype)).to(self.device)
        model.train()
        t = cfg.trainer
        self.model = self.parallel.wrap(model, t.mixed_precision, t.activation_checkpointing)
        if threads is not None:  # world.cpu_affinity=by_need: the servers' cores while they idle
            threads.attach(self.model)
        self.optimizer = adamw(self.model.parameters(), t)
        covered: dict | None = {}  # what the loaded checkpoint's steps read (the base model: nothing)
        if resume_from:
            checkpoint.load_optimizer(self.optimizer, resume_from, self.model, self.parallel)
            keep_kernel(self.optimizer, fused=bool(self.optimizer.defaults["fused"]))
            self.state = checkpoint.read_state(resume_from)
            covered = checkpoint.stream_positions(self.state)
            log.info("resumed from %s at step %d", resume_from, self.state.step)
        self.saved_step = self.state.step  # the step of the newest checkpoint (0: the base model)
        self.published = StatePublisher(self.stopping, self.parallel.ranks.rank, t.max_train_steps)
        heartbeat = self.published.heartbeat
        self.batches = BatchReader(
            self.stopping,
            self.parallel,
            model.config.vocab_size,
            covered,
            heartbeat,
            groups_per_step=cfg.groups_per_step,
            group_size=cfg.algo.group_size,
            num_actors=cfg.actor.num_actors,
        )
        # Rank 0 alone writes metrics (metrics.jsonl, TensorBoard, W&B).
        self.recorder = (
            StepRecorder(
                cfg.metrics,
                run_dir,
                self.stopping,
                num_actors=cfg.actor.num_actors,
                max_train_steps=t.max_train_steps,
            )
            if self.main
            else None
        )
        self.eval_gate = None  # rank 0, with eval.every_steps: evaluated weights stay until their result is in
        if self.recorder is not None and cfg.eval.every_steps:  # rank 0
            self.eval_gate = EvalGate(cfg.eval, t.max_train_steps, self.stopping, heartbeat, self.recorder.write_eval)
        replacing = self.eval_gate.wait_for if self.eval_gate else (lambda version: None)
        self.weights = WeightPublisher(
            t,
            run_dir,
            redis,
            vllm,
            self.parallel,
            broadcast,
            self.stopping.requested,
            heartbeat,
            before_replacing=replacing,
            updating=self.published.updating,
            shared=shared,
        )
        if threads is not None:  # a server reloading beside the step is a server at work
            threads.also_busy_while(self.weights.in_flight)

    # --- the loop ------------------------------------------------------------------------------
    def train(self) -> None:
        t = self.cfg.trainer
        self.published.heartbeat()
        if self.main:  # the groups after what the checkpoint covers are read again, none twice
            positions = self.batches.rewind()
            log.info("reading the groups streams after %s", {s: p.last_id for s, p in positions.items()})
        if self.state.step > 0:  # vLLM must serve the weights of the checkpoint we resumed from
            self.weights.push(self.model, self.state.policy_version, self.state.step)
        elif self.main:  # (a push resumes them too)
            self.vllm.resume_answering()  # an earlier trainer may have died with the servers paused
        self.parallel.barrier()  # every rank is up (and has heartbeaten) before the group is ready
        if self.main:
            self.published.ready(self.state, self.batches.positions)
        while self.state.step < t.max_train_steps:
            started = time.monotonic()
            groups = self.batches.take(self.state.step + 1)  # rank 0 reads them once; every rank takes its share
            if groups is None:  # rank 0 was asked to stop while it waited for them (SIGTERM)
                break
            waited = time.monotonic() - started
            samples = [(g.prompt_ids, s) for g in groups for s in g.samples]
            metrics = optimizer_step(
                self.model, self.optimizer, samples, self.cfg, self.parallel, self.device, self.state.policy_version
            )
            self.state = replace(
                self.state,
                step=self.state.step + 1,
                policy_version=self.state.policy_version + 1,
                samples_processed=self.state.samples_processed + len(samples),
            )
            pushing = time.monotonic()
            version = self.state.policy_version
            self.weights.push(
                self.model, version, self.state.step, overlap=t.overlap_weight_update, replacing=version - 1
            )
            metrics["step_time_s"] = round(time.monotonic() - started, 4)
            metrics["wait_s"] = round(waited, 4)
            metrics["weights_s"] = round(time.monotonic() - pushing, 4)
            # The last whole update: overlapped, the one that finished during this step (none yet at the first).
            update_s = self.weights.last_update_s() if t.overlap_weight_update else metrics["weights_s"]
            metrics["weights_update_s"] = round(update_s, 4) if update_s is not None else None
            paused_s = self.vllm.last_pause_s
            metrics["vllm_paused_s"] = round(paused_s, 4) if paused_s is not None else None
            if self.main:
                assert self.recorder is not None  # rank 0's
                record = self.recorder.record(self.state, metrics, groups, self.batches.bad_messages)
                self.published.progress(self.state, self.batches.positions, reward_mean=record["reward_mean"])
            else:
                self.published.heartbeat()
            if self.state.step % t.checkpoint_every == 0 or self.state.step >= t.max_train_steps:
                self.save_checkpoint()
        if self.state.step < t.max_train_steps:  # stopped on request: a checkpoint at this boundary
            self.weights.finish()
            if self.saved_step != self.state.step:
                self.save_checkpoint()
            if self.main:
                log.info(
                    "stopped on request at step %d; checkpoint %s",
                    self.state.step,
                    self.run_dir.checkpoint(self.state.step),
                )
            return
        if self.main:
            self.weights.finish()  # the last version is served before the trainer says it is done
            if self.eval_gate is not None:  # and evaluated, when due: the actor stops at done
                self.eval_gate.wait_for(self.state.policy_version)
            self.published.done(self.state, self.batches.positions)
            log.info("training done at step %d", self.state.step)

    def save_checkpoint(self) -> None:
        path = self.run_dir.checkpoint(self.state.step)
        if self.main:  # what a trainer restarted from this checkpoint reads again comes after these
            self.state = replace(
                self.state, stream_positions={s: p.to_json() for s, p in self.batches.positions.items()}
            )
        checkpoint.save(
            self.model,
            self.optimizer,
            self.state,
            path,
            keep=self.cfg.trainer.keep_checkpoints,
            parallel=self.parallel,
            tokenizer_from=Path(self.model_path),
        )
        self.saved_step = self.state.step
        if not self.main:
            return
        self.batches.ack_covered()  # the checkpoint now covers these groups
        self.published.progress(self.state, self.batches.positions, last_checkpoint_step=self.state.step)
        log.info("checkpoint %s", path)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()
