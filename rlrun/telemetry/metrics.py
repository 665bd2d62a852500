"""Per-step training metrics: `<run>/metrics.jsonl` always, TensorBoard scalars when asked for.

`FIELDS` names and explains every field of a record (docs/operations.md and the tests follow it).
Knows nothing of Redis or the supervisor: the trainer passes in the actor's counters it read.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from rlrun.errors import EnvironmentProblem
from rlrun.rundir import read_jsonl

# Every field of a metrics.jsonl record, in the order the trainer writes them.
FIELDS: dict[str, str] = {
    "step": "optimizer step the record is for (1, 2, ...). After a trainer restart the steps after its checkpoint are taken again and appear again, later in the file: the later record is the one that counts",
    "samples": "samples trained on so far, this step included",
    "policy_version": "policy version after this step: the weights vLLM is given next",
    "reward_mean": "mean reward of this step's samples",
    "reward_std": "standard deviation (population) of the rewards of this step's samples",
    "tokens": "tokens the model sampled in this step's samples, the ones trained on (prompts and multi-turn observations not counted)",
    "turns_mean": "mean number of model turns in this step's samples (1 without environment.step)",
    "policy_lag_max": "how many policy versions behind the weights that trained on them the oldest tokens of this step were sampled (0: fully on-policy)",
    "behaviour_version_max": "newest policy version that sampled any token of this step",
    "policy_lag_mean": "mean over this step's sampled tokens of how many policy versions behind the trained weights each was sampled",
    "samples_spanning_update": "this step's samples whose tokens were sampled by more than one policy version (in flight across a weight update, which keeps them; vLLM's spans say which tokens each version sampled)",
    "bad_messages": "messages on the groups stream this trainer process rejected so far (malformed, or a wrong group size)",
    "tokens_reused": "actor, whole run: tokens kept from the journal when an actor (re)started (after its crash or restart, or rlrun resume) instead of generated again: each counted once per restart that kept it",
    "samples_continued": "actor, whole run: samples such a restart generated on from a prefix kept in the journal (once per restart)",
    "tokens_kept_on_retry": "actor, whole run: tokens a failed request left in a sample (a vLLM server lost or restarting, a timeout) and kept for its next request: each counted once, however many retries",
    "samples_continued_on_retry": "actor, whole run: samples a failed request left with new tokens, continued from them (once per such request)",
    "tokens_regenerated": "actor, whole run: tokens dropped (stale prefix, or a journal record unreadable) and generated again",
    "prefixes_dropped_stale": "actor, whole run: prefixes dropped because their oldest token was older than actor.max_prefix_staleness versions",
    "groups_published": "actor, whole run: groups published to the trainer",
    "requests": "actor, whole run: generation requests sent to vLLM (one per group, but after a failed request or a restart: one per continued sample)",
    "generating_ms": "actor, whole run: milliseconds of wall time with at least one generation request in flight (vLLM had work); the rest it idled, held back by actor.max_steps_ahead",
    "groups_dropped": "actor, whole run: groups not trained on because a reward call failed and reward.on_error=drop_group",
    "env_steps": "actor, whole run: steps the environment ran (environment.step: tool calls, feedback, last steps)",
    "env_steps_reused": "actor, whole run: the environment's answers kept from the journal when an actor (re)started, not run again",
    "env_steps_rerun": "actor, whole run: steps a crash cut before their answer was journaled, run again (the step function allows it)",
    "env_steps_interrupted": "actor, whole run: steps a crash cut that were not run again (step.rerun_interrupted = False): the model was told",
    "env_step_timeouts": "actor, whole run: steps stopped after environment.timeout_s: the model was told it timed out",
    "env_step_errors": "actor, whole run: steps that raised: their conversation ended with reward 0 (the first traceback is in the actor's log)",
    "observations_truncated": "actor, whole run: observations cut to environment.max_observation_tokens, with a note saying so",
    "reward_errors": "actor, whole run: per reward function, its calls that raised or returned something not a reward ({name: count}; the first traceback of each is in the actor's log)",
    "reward_timeouts": "actor, whole run: per reward function, its calls stopped after reward.timeout_s ({name: count})",
    "time": "wall-clock time (Unix seconds) when the record was written",
    "loss": "policy loss of the step (mean over its passes)",
    "clip_fraction": "share of ratios clipped (tokens for grpo, sequences for gspo)",
    "mean_ratio": "mean importance ratio new/old policy; far from 1 on the first steps means the trainer and vLLM disagree about the weights",
    "grad_norm": "global gradient norm before clipping",
    "logprob_diff_mean": "mean |trainer log-prob - vLLM's| over this step's tokens that vLLM sampled with the weights the trainer held for the step (samples of one version, not spanning an update): numerical noise when both hold the same weights (null: no such token)",
    "logprob_diff_max": "the largest of those differences (null: no such token)",
    "logprob_diff_tokens": "how many tokens those two figures are over",
    "step_time_s": "seconds from the start of waiting for this step's groups to the record (step 1 includes start-up)",
    "wait_s": "of step_time_s, seconds spent waiting for the actor's groups",
    "weights_s": "of step_time_s, seconds the step spent on handing its weights to vLLM (saving and reloading them, or broadcasting them; overlapped: copying them and waiting for the previous update)",
    "weights_update_s": "seconds the last whole weight update took: with trainer.overlap_weight_update, the one that finished during this step, beside the training (null at the first step); without, weights_s",
    "vllm_paused_s": "seconds the last whole weight update held vLLM paused (first /pause sent to last /resume answered): generation stood still this long; requests in flight were kept",
    "ettr": "effective training time ratio of the run so far: optimizer work over wall time, every launch of the run counted (see `rlrun status`)",
}

# The actor's counters copied into every record, from its state hash in Redis.
RECOVERY_COUNTERS = (
    "tokens_reused",
    "samples_continued",
    "tokens_kept_on_retry",
    "samples_continued_on_retry",
    "tokens_regenerated",
    "prefixes_dropped_stale",
)  # `rlrun status` shows these
CONVERSATION_COUNTERS = (
    "env_steps",
    "env_steps_reused",
    "env_steps_rerun",
    "env_steps_interrupted",
    "env_step_timeouts",
    "env_step_errors",
    "observations_truncated",
)  # the actor's, with environment.step: 0 without
ACTOR_COUNTERS = (
    *RECOVERY_COUNTERS,
    "groups_published",
    "requests",
    "generating_ms",
    "groups_dropped",
    *CONVERSATION_COUNTERS,
)
REWARD_FAILURES = ("reward_errors", "reward_timeouts")  # per reward function: the actor's fields `<kind>.<name>`

NOT_SCALARS = ("step", "time")  # the x axis and the wall time of a scalar, not scalars themselves


def summed_actor_counters(states: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Every actor's published counters added up (0 for one not published or unreadable), and
    per reward function its failed calls ({name: count} under each of REWARD_FAILURES)."""
    out: dict[str, Any] = dict.fromkeys(ACTOR_COUNTERS, 0)
    failures: dict[str, dict[str, int]] = {kind: {} for kind in REWARD_FAILURES}
    for state in states:
        for key in ACTOR_COUNTERS:
            value = str(state.get(key) or 0)
            out[key] += int(value) if value.isdigit() else 0
        for key, value in state.items():
            kind, _, name = str(key).partition(".")
            if kind in failures and name and str(value).isdigit():
                failures[kind][name] = failures[kind].get(name, 0) + int(value)
    return {**out, **failures}


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric fields of a record that are plotted as scalars (not step, not time); an
    evaluation's figures per source (`per_source`) as `<source>/<field>`."""

    def numeric(part: Mapping[str, Any]) -> dict[str, float]:
        return {
            k: float(v)
            for k, v in part.items()
            if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    out = numeric(record)
    sources = record.get("per_source")
    for source, part in sources.items() if isinstance(sources, Mapping) else ():
        if isinstance(part, Mapping):
            out.update({f"{source}/{key}": value for key, value in numeric(part).items()})
    return out


def require(package: str) -> None:
    """EnvironmentProblem (exit 3) when `metrics.<package>=true` but the package is not installed."""
    if importlib.util.find_spec(package) is None:
        raise EnvironmentProblem(
            f"metrics.{package}=true needs the {package} package, which is not installed. Install it with "
            f"pip install 'rlrun[{package}]', or set metrics.{package}=false "
            "(metrics.jsonl is written either way)."
        )


require_tensorboard = partial(require, "tensorboard")


class MetricsWriter:
    """Appends step records to a JSONL file (and TensorBoard), each on disk when `write` returns."""

    def __init__(self, path: Path, tensorboard_dir: Path | None = None) -> None:
        self.path = Path(path)
        self._tb = None
        if tensorboard_dir is not None:
            require_tensorboard()
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(tensorboard_dir))

    def write(self, record: Mapping[str, Any]) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(dict(record)) + "\n")
        if self._tb is not None:
            step, walltime = record.get("step"), record.get("time")
            prefix = "" if is_step_record(record) else f"{record['kind']}/"  # eval/reward_mean beside reward_mean
            for key, value in scalars(record).items():
                self._tb.add_scalar(prefix + key, value, global_step=step, walltime=walltime)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


STEP_KIND = "step"  # a record's `kind`; absent: a step record (every record written before kinds)


def is_step_record(record: Mapping[str, Any]) -> bool:
    """Whether a metrics.jsonl record is an optimizer step's: no `kind`, or kind "step". Other kinds
    (an evaluation's, `{"kind": "eval", ...}`) share the file and are no step's."""
    return record.get("kind", STEP_KIND) == STEP_KIND


def read_metrics(path: Path) -> list[dict]:
    """The step records of a metrics.jsonl in file order; a line cut short by a crash, a record of
    another kind (`is_step_record`), or one without an integer step, is skipped, and a field of
    FIELDS that is not a finite number (NaN, a string) is left out of its record, as if not written:
    every reader then takes it as missing."""
    records = []
    for record in read_jsonl(path):
        step = record.get("step")
        if type(step) is not int or not is_step_record(record):
            continue
        records.append({k: v for k, v in record.items() if k not in FIELDS or _well_formed(k, v)})
    return records


EVAL_KIND = "eval"


def eval_records(path: Path) -> list[dict]:
    """The held-out evaluations in metrics.jsonl (records of kind "eval", rlrun/trainer/eval_gate.py),
    one per policy version (the last written: a restarted trainer may write one again), by version."""
    latest: dict[int, dict] = {}
    for record in read_jsonl(path):
        if record.get("kind") == EVAL_KIND and type(record.get("policy_version")) is int:
            latest[record["policy_version"]] = record
    return [latest[v] for v in sorted(latest)]


def _well_formed(key: str, value: Any) -> bool:
    """A field as its kind is written: the per-reward counts a mapping, every other a finite number."""
    return isinstance(value, dict) if key in REWARD_FAILURES else _finite_number(value)


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def final_records(records: list[dict]) -> list[dict]:
    """One record per step, the last one written for it (a retaken step replaces the first), by step."""
    by_step: dict[int, dict] = {}
    for record in records:
        by_step[record["step"]] = record
    return [by_step[step] for step in sorted(by_step)]
