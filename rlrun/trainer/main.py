"""The hf trainer process: `python -m rlrun.trainer.main RUN/roles/trainer.yaml` (rank 0 reads every actor's stream)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import statistics
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from rlrun.cluster.listen import run_prefix
from rlrun.config import RunConfig
from rlrun.errors import ConfigError, ExitCode
from rlrun.inference.admin import VllmAdmin, in_thread
from rlrun.telemetry.ettr import split_wall_time
from rlrun.telemetry.metrics import MetricsWriter, read_metrics, summed_actor_counters
from rlrun.supervisor.events import read_events
from rlrun.streams.rollouts import Group, MalformedGroup
from rlrun.parts.role_file import role_from_argv
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams.codec import decode, encode
from rlrun.streams.server import connect, stop_retrying
from rlrun.trainer import checkpoint
from rlrun.trainer.checkpoint import TrainerState
from rlrun.trainer.disk import DiskFull, temporary_folder
from rlrun.trainer.intake import GroupIntake
from rlrun.trainer.parallel import Parallel, Ranks, collective_backend, usable_device
from rlrun.trainer.step import optimizer_step

if TYPE_CHECKING:
    from rlrun.trainer.weight_broadcast import BroadcastSync

log = logging.getLogger("rlrun.trainer")

VLLM_WAIT_S = 600.0  # a weight update waits this long for a restarting vLLM server
# A SLURM job's cancel signals all its processes at once, in no order: Redis may be gone a moment
# before our own SIGTERM arrives. A lost Redis waits this long for one before it is a failure.
STOP_RACE_S = 2.0


class Trainer:
    def __init__(
        self, cfg: RunConfig, run_dir: RunDir, redis, model_path: str, vllm: VllmAdmin, parallel: Parallel | None = None,
        broadcast: "BroadcastSync | None" = None, stop: threading.Event | None = None,
    ) -> None:
        """`stop`: set (by SIGTERM) to stop at the next step boundary with a checkpoint there."""
        import torch
        from transformers import AutoModelForCausalLM

        self.cfg, self.run_dir, self.redis, self.vllm = cfg, run_dir, redis, vllm
        self.stop = stop if stop is not None else threading.Event()
        self.broadcast = broadcast  # None: weights go through files (trainer.weight_transfer=disk)
        self._update: Future | None = None  # the weight update in flight (trainer.overlap_weight_update)
        self.last_update_s: float | None = None  # how long the last overlapped update took
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
        self.vocab_size = model.config.vocab_size
        t = cfg.trainer
        self.model = self.parallel.wrap(model, t.mixed_precision, t.activation_checkpointing)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay
        )
        self._covered: dict | None = {}  # what the loaded checkpoint's steps read (the base model: nothing)
        if resume_from:
            checkpoint.load_optimizer(self.optimizer, resume_from, self.model, self.parallel)
            self.state = checkpoint.read_state(resume_from)
            self._covered = checkpoint.stream_positions(self.state)
            log.info("resumed from %s at step %d", resume_from, self.state.step)
        self.saved_step = self.state.step  # the step of the newest checkpoint (0: the base model)
        self.bad_messages = 0
        # Acked once a checkpoint covers them (a restart finds its place from the checkpoint's positions).
        self.unacked: list[tuple[str, str]] = []  # (stream, message id); rank 0's only
        # One stream per actor, read one at a time: one XREADGROUP cannot span Redis Cluster slots.
        self.intake = GroupIntake(redis, names.groups_streams(cfg.actor.num_actors), names.TRAINER_GROUP) if self.main else None
        # Rank 0 alone writes metrics (metrics.jsonl, TensorBoard, W&B): the others keep a writer of nothing.
        tensorboard = run_dir.tensorboard if cfg.metrics.tensorboard and self.main else None
        self.metrics = MetricsWriter(run_dir.metrics, tensorboard)
        self.history = read_metrics(run_dir.metrics)  # every record so far, this run's earlier launches too: for ETTR
        self.wandb = None
        if cfg.metrics.wandb and self.main:  # the same W&B run for every trainer attempt and every launch of this run
            from rlrun.telemetry.wandb_sink import WandbSink

            last = self.history[-1]["time"] if self.history else None
            self.wandb = WandbSink(run_dir, cfg.metrics.wandb_project, cfg.metrics.wandb_mode, last_step_time=last)

    # --- the loop ------------------------------------------------------------------------------
    def train(self) -> None:
        t = self.cfg.trainer
        self._heartbeat()
        if self.main:  # the groups after what the checkpoint covers are read again, none twice
            positions = self.intake.rewind(self._covered)
            log.info("reading the groups streams after %s", {s: p.last_id for s, p in positions.items()})
        if self.state.step > 0:  # vLLM must serve the weights of the checkpoint we resumed from
            self._push_weights()
        elif self.main:  # (a push resumes them too)
            self.vllm.resume_answering()  # an earlier trainer may have died with the servers paused
        self.parallel.barrier()  # every rank is up (and has heartbeaten) before the group is ready
        if self.main:
            self._publish_state(ready_pid=os.getpgrp(), **{names.TRAINING_DONE: 0})  # not this launch's, not yet
        while self.state.step < t.max_train_steps:
            started = time.monotonic()
            groups, message_ids = self._next_batch() if self.main else ([], [])
            groups = self._shared(groups)  # rank 0 read them once; every rank takes its share
            if groups is None:  # rank 0 was asked to stop while it waited for them (SIGTERM)
                break
            waited = time.monotonic() - started
            samples = [(g.prompt_ids, s) for g in groups for s in g.samples]
            metrics = optimizer_step(self.model, self.optimizer, samples, self.cfg, self.parallel, self.device, self.state.policy_version)
            self.state = replace(
                self.state, step=self.state.step + 1, policy_version=self.state.policy_version + 1,
                samples_processed=self.state.samples_processed + len(samples),
            )  # fmt: skip
            pushing = time.monotonic()
            self._push_weights(overlap=t.overlap_weight_update)
            self.unacked.extend(message_ids)
            metrics["step_time_s"] = round(time.monotonic() - started, 4)
            metrics["wait_s"] = round(waited, 4)
            metrics["weights_s"] = round(time.monotonic() - pushing, 4)
            # The last whole update: overlapped, the one that finished during this step (none yet at the first).
            update_s, self.last_update_s = (self.last_update_s if t.overlap_weight_update else metrics["weights_s"]), None
            metrics["weights_update_s"] = round(update_s, 4) if update_s is not None else None
            paused_s = self.vllm.last_pause_s
            metrics["vllm_paused_s"] = round(paused_s, 4) if paused_s is not None else None
            if self.main:
                self._record(metrics, groups)
            else:
                self._heartbeat()
            if self.state.step % t.checkpoint_every == 0 or self.state.step >= t.max_train_steps:
                self._save_checkpoint()
        if self.state.step < t.max_train_steps:  # stopped on request: a checkpoint at this boundary
            self._finish_update()
            if self.saved_step != self.state.step:
                self._save_checkpoint()
            if self.main:
                log.info("stopped on request at step %d; checkpoint %s", self.state.step, self.run_dir.checkpoint(self.state.step))
            return
        if self.main:
            self._finish_update()  # the last version is served before the trainer says it is done
            self._publish_state(**{names.TRAINING_DONE: 1})
            log.info("training done at step %d", self.state.step)

    def close(self) -> None:
        self.metrics.close()
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None

    # --- input ---------------------------------------------------------------------------------
    def _next_batch(self) -> tuple[Optional[list[Group]], list[tuple[str, str]]]:
        """Block until one optimizer step's worth of whole groups has arrived (from any actor);
        (None, []) once asked to stop: what this batch read is given back (not covered by the
        positions a checkpoint records, so read again after a restart)."""
        import redis

        wanted = self.cfg.groups_per_step
        groups: list[Group] = []
        ids: list[tuple[str, str]] = []
        read_before = dict(self.intake.positions)

        def keep_waiting() -> bool:
            self._heartbeat(waiting_for=f"groups ({len(groups)} of {wanted} for step {self.state.step + 1})")
            return not self.stop.is_set()

        while len(groups) < wanted:
            try:
                messages = self.intake.read(wanted - len(groups), keep_waiting)
            except redis.ConnectionError:
                if not self._stopping():  # else Redis stopped with us (a SLURM job's cancel signals every process)
                    raise
                messages = []
            if not messages:  # asked to stop
                self.intake.positions = read_before
                return None, []
            for stream, message_id, fields in messages:
                ids.append((stream, message_id))
                try:
                    group = Group.from_dict(decode(fields.get("data", "")), vocab_size=self.vocab_size)
                    if len(group.samples) != self.cfg.algo.group_size:
                        raise MalformedGroup(f"group {group.group_id} has {len(group.samples)} samples, "
                                             f"expected {self.cfg.algo.group_size}")  # fmt: skip
                except (MalformedGroup, ValueError) as exc:
                    self.bad_messages += 1
                    log.warning("rejected message %s on %s: %s", message_id, stream, exc)
                    continue
                groups.append(group)
        return groups, ids

    def _shared(self, groups: Optional[list[Group]]) -> Optional[list[Group]]:
        """Rank 0's groups on every rank; None on every rank when rank 0 stops (the ranks decide
        together: each got SIGTERM, but at its own moment)."""
        if not self.parallel.ranks.distributed:
            return groups
        payload = json.dumps(None if groups is None else [g.to_dict() for g in groups]).encode() if self.main else None
        data = self.parallel.share(payload, self._heartbeat)
        if self.main:
            return groups
        shared = json.loads(data)
        return None if shared is None else [Group.from_dict(d) for d in shared]

    # --- weights to vLLM -----------------------------------------------------------------------
    def _push_weights(self, overlap: bool = False) -> None:
        """Hand this version's weights to every vLLM server that answers (a server being restarted
        loads weights/current at its start). `overlap`: in a thread, while the next step trains;
        an update still in flight is finished first, so at most one is."""
        version, step = self.state.policy_version, self.state.step  # (the thread must not read self.state)
        weights = self.parallel.full_state_dict(self.model)  # every rank takes part; rank 0 gets them
        if not self.main:
            return
        self._finish_update()
        if not overlap:
            return self._hand_over(weights, version, step)
        # The next step changes the parameters in place: the thread sends a copy taken now.
        weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}

        def timed() -> float:
            started = time.monotonic()
            self._hand_over(weights, version, step)
            return time.monotonic() - started

        self._update = in_thread(timed)  # its failure is re-raised by _finish_update

    def _finish_update(self) -> None:
        update, self._update = self._update, None
        if update is not None:
            self.last_update_s = update.result()

    def _hand_over(self, weights: dict, version: int, step: int) -> None:
        """Through a folder (trainer.weight_transfer=disk) or a broadcast from rank 0
        (=broadcast, rlrun/trainer/weight_broadcast.py)."""
        publish = lambda: self.redis.set(names.POLICY_VERSION, version)  # noqa: E731
        bare = self.parallel.unwrapped(self.model)
        if self.broadcast is None:  # first the folder: a server (re)starting from now on loads it
            target = write_weights(self.run_dir, bare, weights, version)
            down = self._until_vllm_answers(lambda: self.vllm.update_from_folder(str(target), version, publish))
        else:
            from rlrun.trainer.weight_broadcast import disk_copy_due

            copied = []  # a folder for the servers that start cold, written at most once per version

            def broadcast():
                try:
                    return self.broadcast.update(weights, version, publish, self._heartbeat)
                except Exception:  # none answers, or the broadcast failed: a server may be restarting
                    if not copied:  # it loads weights/current at its start: make that this version
                        copied.append(write_weights(self.run_dir, bare, weights, version))
                        log.info("weights v%d written to weights/current for a vLLM server that starts cold", version)
                    raise

            down = self._until_vllm_answers(broadcast)
            t = self.cfg.trainer
            if not copied and disk_copy_due(step, t.checkpoint_every, t.max_train_steps, down):
                write_weights(self.run_dir, bare, weights, version)
        if down:
            log.warning("weights v%d: %s not reachable (restarting: it starts from weights/current)", version, ", ".join(down))

    def _until_vllm_answers(self, action) -> None:
        """Retry a weight update while a vLLM server is down (the supervisor restarts it)."""
        import httpx

        deadline = time.monotonic() + VLLM_WAIT_S
        while True:
            try:
                return action()
            except (httpx.HTTPError, RuntimeError) as exc:
                if self.stop.is_set():  # the servers stop with us: a restart hands them its checkpoint's weights
                    log.warning("weight update given up while stopping: %s", exc)
                    return None
                if time.monotonic() > deadline:
                    raise
                log.warning("weight update waits for vLLM: %s", exc)
                self._heartbeat(waiting_for=f"a vLLM server for the weight update ({exc})")
                time.sleep(2.0)

    # --- progress, checkpoints -----------------------------------------------------------------
    def _record(self, metrics: dict, groups: list[Group]) -> None:
        rewards = [s.reward for g in groups for s in g.samples]
        versions = [v for g in groups for s in g.samples for v in s.versions]
        record = {
            "step": self.state.step,
            "samples": self.state.samples_processed,
            "policy_version": self.state.policy_version,
            "reward_mean": round(sum(rewards) / len(rewards), 4),
            "reward_std": round(statistics.pstdev(rewards), 4),
            "tokens": sum(len(s.completion_ids) for g in groups for s in g.samples),
            # how many versions behind the weights that trained on them the tokens were sampled
            "policy_lag_max": (self.state.policy_version - 1 - min(versions)) if versions else 0,
            "behaviour_version_max": max(versions) if versions else 0,  # newest version vLLM sampled with
            "policy_lag_mean": round(self.state.policy_version - 1 - statistics.fmean(versions), 4) if versions else 0.0,
            "samples_spanning_update": sum(1 for g in groups for s in g.samples if len(set(s.versions)) > 1),
            "bad_messages": self.bad_messages,
            **self._redis(lambda: summed_actor_counters([self.redis.hgetall(key) for key in names.actor_states(self.cfg.actor.num_actors)]), {}),
            "time": round(time.time(), 3),
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()},
        }
        self.history.append(record)
        events = read_events(self.run_dir.events)
        ratio = split_wall_time(events, self.history, now=record["time"]).ettr  # rlrun/telemetry/ettr.py
        record["ettr"] = round(ratio, 4) if ratio is not None else None
        self.metrics.write(record)
        if self.wandb is not None:
            self.wandb.log(record, events)
        with open(self.run_dir.trained_groups, "a") as handle:  # a restarted step appears again, later
            handle.write(json.dumps({"step": self.state.step, "groups": [g.group_id for g in groups]}) + "\n")
        self._publish_state(reward_mean=record["reward_mean"])
        self._redis(lambda: self.redis.xadd(names.TRAINER_EVENTS, {"event": encode({"type": "step", **record})}, maxlen=10_000))
        log.info(
            "step %d/%d samples=%d reward=%.3f loss=%.4f clip=%.3f %.2fs",
            self.state.step, self.cfg.trainer.max_train_steps, self.state.samples_processed,
            record["reward_mean"], record["loss"], record["clip_fraction"], record["step_time_s"],
        )  # fmt: skip

    def _heartbeat(self, waiting_for: str = "") -> None:
        """Rank 0 writes `pid`, `heartbeat` and what it waits for (diagnostics of a stalled run); rank
        r>0 `heartbeat_rank<r>` (the watchdog reads every rank)."""
        if self.main:
            self._redis(lambda: self.redis.hset(names.TRAINER_STATE, mapping={"pid": os.getpgrp(), "heartbeat": time.time(), "waiting_for": waiting_for}))
        else:
            self._redis(lambda: self.redis.hset(names.TRAINER_STATE, names.rank_heartbeat(self.parallel.ranks.rank), time.time()))

    def _publish_state(self, **extra) -> None:
        """Progress, and per stream the entries the steps taken read: the actors' back-pressure
        counts what is beyond them (rlrun/actor/trainer_view.py)."""
        trained = {names.trained_entries(s): p.entries_read for s, p in self.intake.positions.items()}
        mapping = {
            **trained,
            "step": self.state.step,
            "samples_processed": self.state.samples_processed,
            "policy_version": self.state.policy_version,
            "max_train_steps": self.cfg.trainer.max_train_steps,
            "pid": os.getpgrp(),  # the group the supervisor started (its guard leads it)
            "heartbeat": time.time(),
            **extra,
        }
        self._redis(lambda: self.redis.hset(names.TRAINER_STATE, mapping=mapping))

    def _redis(self, action, default=None):
        """`action()`; while stopping, Redis may be gone already (every process of a cancelled
        SLURM job is signalled at once): then `default`, and the step is recorded in files only.
        A lost acknowledgement costs nothing: a restart finds its place from the checkpoint's
        stream positions."""
        import redis

        if self.stop.is_set():
            stop_retrying(self.redis)  # (a client made after the signal)
        try:
            return action()
        except redis.ConnectionError as exc:
            if not self._stopping():
                raise
            log.warning("Redis not reachable while stopping (%s): left out", exc)
            return default

    def _stopping(self) -> bool:
        """Asked to stop, now or within STOP_RACE_S (a dependency that just vanished may be
        stopping with us, its signal a moment ahead of ours)."""
        return self.stop.is_set() or self.stop.wait(STOP_RACE_S)

    def _save_checkpoint(self) -> None:
        path = self.run_dir.checkpoint(self.state.step)
        if self.main:  # what a trainer restarted from this checkpoint reads again comes after these
            self.state = replace(self.state, stream_positions={s: p.to_json() for s, p in self.intake.positions.items()})
        checkpoint.save(self.model, self.optimizer, self.state, path, keep=self.cfg.trainer.keep_checkpoints, parallel=self.parallel)
        self.saved_step = self.state.step
        if not self.main:
            return
        self._redis(lambda: self.intake.ack(self.unacked))  # the checkpoint now covers these groups
        self.unacked = []
        self._publish_state(last_checkpoint_step=self.state.step)
        log.info("checkpoint %s", path)


def write_weights(run_dir: RunDir, model, weights: dict, version: int):
    """weights/vNNNNNN written whole and renamed into place, weights/current pointed at it; older
    versions deleted but the one current pointed at before (it may still be loading somewhere)."""
    target = run_dir.weights_version(version)
    tmp = target.with_name(f".tmp-{target.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    with temporary_folder(tmp):  # removed if the write fails; DiskFull when the disk is full
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    current = run_dir.current_weights
    previous = os.path.basename(os.readlink(current)) if current.is_symlink() else ""
    run_dir.point_current_weights(target)
    for old in run_dir.weights.glob("v*"):
        if old.name not in {target.name, previous}:
            shutil.rmtree(old, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    vllm = parallel = broadcast = None
    stop = threading.Event()  # SIGTERM (the supervisor's orderly stop, a SLURM job's end): stop at the next step boundary
    clients = []  # Redis clients: stopping, a Redis that stopped with us is not waited for

    def on_sigterm(*_) -> None:
        stop.set()
        for client in clients:
            stop_retrying(client)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        role = role_from_argv("rlrun::trainer", argv)
        cfg, run_dir = role.load_config(), role.run
        # One rank unless a launcher (rlrun.trainer.rank_group, torchrun) set RANK/WORLD_SIZE.
        ranks = Ranks.from_env(os.environ)
        device = usable_device(ranks.device(cfg.trainer.device))  # no such device here: exit 2
        checkpoint.resume_point(run_dir.checkpoints)  # damaged checkpoints: exit 2 before any server is asked
        redis = connect(role.redis_url, run_dir.read_redis_password())
        clients.append(redis)
        vllm = VllmAdmin(role.vllm_urls, api_key=run_dir.read_vllm_api_key())
        store_prefix = run_prefix(run_dir.read_vllm_api_key()) if ranks.distributed else ""  # keys of the ranks' store
        parallel = Parallel(ranks, cfg.trainer.sharding, device, store_prefix)
        if cfg.trainer.weight_transfer == "broadcast" and parallel.ranks.is_main:
            from rlrun.trainer.weight_broadcast import BroadcastSync

            broadcast = BroadcastSync(vllm, role.broadcast_host, role.broadcast_port, collective_backend(cfg.trainer.device),
                                      prefix=run_prefix(run_dir.read_vllm_api_key()))  # fmt: skip
        trainer = Trainer(cfg, run_dir, redis, role.model_path, vllm, parallel, broadcast, stop)
        try:
            trainer.train()
        finally:
            trainer.close()
    except (ConfigError, checkpoint.CorruptCheckpoint, DiskFull) as exc:
        # A restart would meet the same config, checkpoints or full disk: exit 2, which the
        # supervisor never retries (the run stops at once with exit 5, naming this log).
        log.error("%s", exc)
        return int(ExitCode.USAGE)
    finally:
        if broadcast is not None:
            broadcast.close()
        if vllm is not None:
            vllm.close()
        if parallel is not None:
            parallel.close()
    return 0


if __name__ == "__main__":
    from rlrun.telemetry import proctitle, stackdump

    rank = os.environ.get("RANK") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    proctitle.name(f"trainer-rank{rank}" if rank else "trainer")  # `ps` shows rlrun:trainer (-rank1...)
    stackdump.enable()  # `kill -USR1` dumps the stacks into the log (the supervisor's fallback to py-spy)
    raise SystemExit(main())
