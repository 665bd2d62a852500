"""Rank 0's record of each optimizer step: one line of metrics.jsonl carrying the run's ETTR so far
(to TensorBoard and W&B too when they are on), the step's group ids in trained_groups.jsonl, the
record on the trainer's events stream, and the log line; and of each held-out evaluation
(`write_eval`): metrics.jsonl, TensorBoard and W&B.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time

from rlrun.config.schema import MetricsConfig
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams.codec import encode
from rlrun.streams.rollouts import Group
from rlrun.supervisor.events import EventTail
from rlrun.telemetry.ettr import RunningEttr
from rlrun.telemetry.metrics import MetricsWriter, read_metrics, summed_actor_counters
from rlrun.telemetry.wandb_sink import EVENTS_SENT
from rlrun.trainer.checkpoint import TrainerState
from rlrun.trainer.stopping import Stopping

log = logging.getLogger("rlrun.trainer")


class StepRecorder:
    """`metrics`: where the records go besides metrics.jsonl; `num_actors` (whose counters each
    record sums) and `max_train_steps` (the log line's target) are the rest it reads of the config."""

    def __init__(
        self, metrics: MetricsConfig, run_dir: RunDir, stopping: Stopping, *, num_actors: int, max_train_steps: int
    ) -> None:
        self.run_dir, self.stopping = run_dir, stopping
        self.num_actors, self.max_train_steps = num_actors, max_train_steps
        self.metrics = MetricsWriter(run_dir.metrics, run_dir.tensorboard if metrics.tensorboard else None)
        self.wandb = None
        self._writing = threading.Lock()  # an evaluation may be written from an overlapped weight update's thread
        # ETTR over every record and event so far, this run's earlier launches too, read once here:
        # each step then reads only the events appended since (constant cost per step)
        events, history = self._history()
        self.ettr = RunningEttr(events, history, reload=self._history)
        if metrics.wandb:  # the same W&B run for every trainer attempt and every launch of this run
            from rlrun.telemetry.wandb_sink import WandbSink

            last = history[-1]["time"] if history else None
            self.wandb = WandbSink(run_dir, metrics.wandb_project, metrics.wandb_mode, last_step_time=last)

    def record(self, state: TrainerState, metrics: dict, groups: list[Group], bad_messages: int) -> dict:
        """The step `state` has just taken, from its optimizer `metrics` and the `groups` it trained;
        returns the record written."""
        redis = self.stopping.redis
        rewards = [s.reward for g in groups for s in g.samples]
        # The model's tokens only: observations (multi-turn) were not sampled, by any version.
        versions = [v for g in groups for s in g.samples for v in s.sampled(s.versions)]
        actors = names.actor_states(self.num_actors)
        record = {
            "step": state.step,
            "samples": state.samples_processed,
            "policy_version": state.policy_version,
            "reward_mean": round(sum(rewards) / len(rewards), 4),
            "reward_std": round(statistics.pstdev(rewards), 4),
            # tokens trained on (throughput in `rlrun plot`): an observation's are context, not trained
            "tokens": len(versions),
            # a conversation's model turns: one more than the observations between them
            "turns_mean": round(statistics.fmean(len(s.observation_spans) + 1 for g in groups for s in g.samples), 4),
            # how many versions behind the weights that trained on them the tokens were sampled
            "policy_lag_max": (state.policy_version - 1 - min(versions)) if versions else 0,
            "behaviour_version_max": max(versions) if versions else 0,  # newest version vLLM sampled with
            "policy_lag_mean": round(state.policy_version - 1 - statistics.fmean(versions), 4) if versions else 0.0,
            "samples_spanning_update": sum(1 for g in groups for s in g.samples if len(set(s.sampled(s.versions))) > 1),
            "bad_messages": bad_messages,
            **self.stopping.call(lambda: summed_actor_counters([redis.hgetall(key) for key in actors]), {}),
            "time": round(time.time(), 3),
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()},
        }
        events = self._events.read()
        self._sent_events += [e for e in events if e.get("event") in EVENTS_SENT]
        ratio = self.ettr.add(events, record, now=record["time"])  # may read the history again: _history
        record["ettr"] = round(ratio, 4) if ratio is not None else None
        with self._writing:
            self.metrics.write(record)
            if self.wandb is not None:
                self.wandb.log(record, self._sent_events)
        with open(self.run_dir.trained_groups, "a") as handle:  # a restarted step appears again, later
            handle.write(json.dumps({"step": state.step, "groups": [g.group_id for g in groups]}) + "\n")
        self.stopping.call(
            lambda: redis.xadd(names.TRAINER_EVENTS, {"event": encode({"type": "step", **record})}, maxlen=10_000)
        )
        log.info(
            "step %d/%d samples=%d reward=%.3f loss=%.4f clip=%.3f %.2fs",
            state.step,
            self.max_train_steps,
            state.samples_processed,
            record["reward_mean"],
            record["loss"],
            record["clip_fraction"],
            record["step_time_s"],
        )
        return record

    def _history(self) -> tuple[list[dict], list[dict]]:
        """Every event and step record so far, read from the start; the events read on from there.
        Of the events, only those the W&B sink reads (EVENTS_SENT: it sends them and counts the
        failures and restarts among them) stay in memory: as many as failures, not steps."""
        self._events = EventTail(self.run_dir.events)
        events = self._events.read()
        self._sent_events = [e for e in events if e.get("event") in EVENTS_SENT]
        return events, read_metrics(self.run_dir.metrics)

    def write_eval(self, record: dict) -> None:
        """A held-out evaluation's record (`rlrun/trainer/eval_gate.py`): a line of metrics.jsonl,
        and `eval/...` scalars in TensorBoard and W&B when they are on."""
        with self._writing:
            self.metrics.write(record)
            if self.wandb is not None:
                self.wandb.log_eval(record)

    def close(self) -> None:
        self.metrics.close()
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None
