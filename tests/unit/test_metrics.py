"""The per-step metrics writer: JSONL always, TensorBoard when asked; the trainer's record."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from rlrun.config import compose
from rlrun.config.build import from_dict
from rlrun.config.schema import RunConfig
from rlrun.errors import EnvironmentProblem, ExitCode
from rlrun.telemetry.metrics import (
    ACTOR_COUNTERS,
    CONVERSATION_COUNTERS,
    FIELDS,
    MetricsWriter,
    final_records,
    read_metrics,
    require_tensorboard,
    scalars,
    summed_actor_counters,
)


def record(step: int, **extra) -> dict:
    return {"step": step, "samples": 256 * step, "reward_mean": 0.25 * step, "time": 1000.0 + step, "note": "x", **extra}


def test_each_write_is_one_json_line_on_disk_at_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.write(record(1))
    assert [json.loads(line) for line in path.read_text().splitlines()] == [record(1)]  # before close
    writer.write(record(2))
    writer.close()
    assert read_metrics(path) == [record(1), record(2)]
    assert not (tmp_path / "tensorboard").exists()


def test_reading_skips_a_line_cut_short_and_lines_that_are_not_step_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(record(1)) + "\n" + '["not a record"]\n{"no_step": 1}\n' + json.dumps(record(2))[:20])
    assert read_metrics(path) == [record(1)]
    assert read_metrics(tmp_path / "missing.jsonl") == []


def test_a_step_retaken_after_a_trainer_restart_replaces_the_first_record():
    first, retaken = record(5, reward_mean=0.1), record(5, reward_mean=0.9)
    assert final_records([record(4), first, record(6), retaken, record(6, reward_mean=0.5)]) == [
        record(4), retaken, record(6, reward_mean=0.5)
    ]  # fmt: skip


def test_actor_counters_come_from_the_published_hashes_added_up_and_default_to_zero():
    published = {"tokens_reused": "120", "samples_continued": "7", "tokens_kept_on_retry": "9", "pid": "42", "heartbeat": "1.5",
                 "prefixes_dropped_stale": "bad"}  # fmt: skip
    assert summed_actor_counters([published]) == {"tokens_reused": 120, "samples_continued": 7, "tokens_kept_on_retry": 9,
                                                  "samples_continued_on_retry": 0, "tokens_regenerated": 0, "prefixes_dropped_stale": 0,
                                                  "groups_published": 0, "requests": 0, "generating_ms": 0, "groups_dropped": 0,
                                                  **dict.fromkeys(CONVERSATION_COUNTERS, 0), "reward_errors": {}, "reward_timeouts": {}}  # fmt: skip
    assert summed_actor_counters([published, {"tokens_reused": "3"}])["tokens_reused"] == 123
    assert summed_actor_counters([{}]) == {**dict.fromkeys(ACTOR_COUNTERS, 0), "reward_errors": {}, "reward_timeouts": {}}


def test_reward_failures_are_summed_per_reward_over_the_actors():
    first = {"reward_errors.boom": "2", "reward_timeouts.slow": "1", "reward_errors.": "5", "other.boom": "9"}
    second = {"reward_errors.boom": "3", "reward_errors.parse": "1", "reward_timeouts.slow": "x"}
    summed = summed_actor_counters([first, second])
    assert summed["reward_errors"] == {"boom": 5, "parse": 1}
    assert summed["reward_timeouts"] == {"slow": 1}


def test_scalars_are_the_numeric_fields_except_step_and_time():
    assert scalars({"step": 3, "time": 5.0, "loss": 0.5, "tokens": 7, "note": "x", "flag": True}) == {"loss": 0.5, "tokens": 7.0}


def test_every_actor_counter_is_a_documented_field():
    assert set(ACTOR_COUNTERS) <= set(FIELDS)
    assert all(FIELDS.values())


def test_tensorboard_gets_the_same_scalars_per_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tensorboard"
    writer = MetricsWriter(tmp_path / "metrics.jsonl", board)
    writer.write(record(1, loss=0.5))
    writer.write(record(2, loss=0.25))
    writer.close()
    files = list(board.glob("events.out.tfevents.*"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    events = EventAccumulator(str(board))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"samples", "reward_mean", "loss"}
    assert [(e.step, e.value, e.wall_time) for e in events.Scalars("loss")] == [(1, 0.5, 1001.0), (2, 0.25, 1002.0)]
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 2  # the JSONL is written as well


def test_without_the_tensorboard_package_a_clear_error_and_nothing_written(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(EnvironmentProblem, match=r"rlrun\[tensorboard\].*metrics.tensorboard=false") as caught:
        MetricsWriter(tmp_path / "metrics.jsonl", tmp_path / "tensorboard")
    assert caught.value.exit_code == ExitCode.ENVIRONMENT
    with pytest.raises(EnvironmentProblem):
        require_tensorboard()
    assert list(tmp_path.iterdir()) == []


def test_metrics_config_defaults_off_and_configs_saved_without_it_still_load():
    cfg, _ = compose([])
    assert cfg.metrics.tensorboard is False
    on, _ = compose(["metrics.tensorboard=true"])
    assert on.metrics.tensorboard is True
    data = {k: v for k, v in _resolved_dict().items() if k != "metrics"}  # a run made before `metrics`
    assert from_dict(RunConfig, data).metrics.tensorboard is False


def _resolved_dict() -> dict:
    import yaml

    _, resolved = compose([])
    return yaml.safe_load(resolved)


class FakeRedis:
    def __init__(self, actor_state: dict) -> None:
        self.hashes = {"rlrun:actor:state": actor_state}
        self.streams: list = []

    def hgetall(self, key):
        return dict(self.hashes.get(key, {}))

    def xadd(self, stream, fields, maxlen=None):
        self.streams.append((stream, fields))


def test_the_trainer_record_has_every_documented_field_and_the_actor_counters(tmp_path):
    """The trainer's StepRecorder as the trainer builds it (no torch), over a stand-in Redis."""
    from rlrun.streams.rollouts import Group, Sample
    from rlrun.rundir import RunDir
    from rlrun.trainer.checkpoint import TrainerState
    from rlrun.trainer.recorder import StepRecorder
    from rlrun.trainer.stopping import Stopping

    cfg, _ = compose(["trainer.max_train_steps=3"])
    run_dir = RunDir(Path(tmp_path))
    redis = FakeRedis({"tokens_reused": "40", "tokens_regenerated": "3", "samples_continued": "5", "prefixes_dropped_stale": "1", "pid": "9",
                       "tokens_kept_on_retry": "6", "samples_continued_on_retry": "2"})  # fmt: skip
    recorder = StepRecorder(cfg.metrics, run_dir, Stopping(redis), num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)
    started = time.time() - 10  # the run started 10 s ago, and its only step took 0.5 s of optimizer work
    (Path(tmp_path) / "events.jsonl").write_text(json.dumps({"time": started, "event": "run_started"}) + "\n")
    samples = [Sample(i, [1, 2, 3], [-0.1] * 3, [0, 1, 1], "stop", float(i % 2), 0.0) for i in range(4)]
    returned = recorder.record(
        TrainerState(step=2, samples_processed=4, policy_version=2),
        {"loss": 0.1, "clip_fraction": 0.0, "mean_ratio": 1.0, "grad_norm": 2.0, "logprob_diff_mean": 1e-6, "logprob_diff_max": 3e-6,
         "logprob_diff_tokens": 6, "step_time_s": 0.9, "wait_s": 0.3, "weights_s": 0.1, "weights_update_s": 0.2,
         "vllm_paused_s": 0.05},
        [Group("run/0", 0, [5, 6], samples)],
        bad_messages=0,
    )
    (written,) = read_metrics(run_dir.metrics)
    assert written == returned and [stream for stream, _ in redis.streams] == ["rlrun:trainer:events"]
    assert [json.loads(line)["groups"] for line in run_dir.trained_groups.read_text().splitlines()] == [["run/0"]]
    assert list(written) == list(FIELDS), "metrics.jsonl fields and rlrun.telemetry.metrics.FIELDS (docs) disagree"
    # over the wall time up to the record's own time (not 10 s: the test's own time counts too)
    assert written["ettr"] == pytest.approx(0.5 / (written["time"] - started), abs=1e-4)  # rounded to 4 places
    assert (written["tokens_reused"], written["tokens_regenerated"], written["samples_continued"], written["prefixes_dropped_stale"]) == (40, 3, 5, 1)
    assert (written["tokens_kept_on_retry"], written["samples_continued_on_retry"]) == (6, 2)
    assert (written["reward_mean"], written["reward_std"], written["tokens"], written["policy_lag_max"]) == (0.5, 0.5, 12, 1)
    # versions [0, 1, 1] against the step's trained weights (policy_version 2 - 1): lags 1, 0, 0
    assert (written["policy_lag_mean"], written["samples_spanning_update"]) == (pytest.approx(1 / 3, abs=1e-4), 4)


def test_the_trainer_record_counts_and_ages_the_models_tokens_not_the_observations(tmp_path):
    """A multi-turn step: the observation tokens (versions 0, the actor's filler) are neither
    trained-on tokens nor sampled by a version, so they change no count and no lag."""
    from rlrun.streams.rollouts import Group, Sample
    from rlrun.rundir import RunDir
    from rlrun.trainer.checkpoint import TrainerState
    from rlrun.trainer.recorder import StepRecorder
    from rlrun.trainer.stopping import Stopping

    cfg, _ = compose(["trainer.max_train_steps=3"])
    run_dir = RunDir(Path(tmp_path))
    recorder = StepRecorder(cfg.metrics, run_dir, Stopping(FakeRedis({})), num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)
    # 5 tokens each, 2 of them an observation: 3 sampled tokens, all by version 2
    samples = [Sample(i, [1, 2, 3, 4, 5], [-0.1, 0.0, 0.0, -0.2, -0.3], [2, 0, 0, 2, 2], "stop", 1.0, 0.0, [[1, 3]]) for i in range(2)]
    written = recorder.record(TrainerState(step=3, samples_processed=4, policy_version=3),
                              {"loss": 0.1, "clip_fraction": 0.0, "mean_ratio": 1.0, "step_time_s": 0.5},
                              [Group("run/0", 0, [5, 6], samples)], bad_messages=0)  # fmt: skip
    recorder.close()
    assert written["tokens"] == 6
    assert (written["policy_lag_max"], written["policy_lag_mean"], written["behaviour_version_max"]) == (0, 0.0, 2)
    assert written["samples_spanning_update"] == 0


EVAL = {"kind": "eval", "step": 4, "policy_version": 4, "prompts": 3, "k": 2, "reward_mean": 0.5, "pass@1": 0.5, "pass@2": 0.6667,
        "correct": [2, 1, 0], "per_source": {"easy": {"prompts": 2, "k": 2, "reward_mean": 0.75, "pass@1": 0.75, "pass@2": 1.0, "correct": [2, 1]},
                                             "hard": {"prompts": 1, "k": 2, "reward_mean": 0.0, "pass@1": 0.0, "pass@2": 0.0, "correct": [0]}},
        "eval_s": 1.5, "time": 1004.5}  # fmt: skip


def test_an_evaluations_scalars_are_its_figures_and_each_sources_under_its_name():
    assert scalars(EVAL) == {
        "policy_version": 4.0, "prompts": 3.0, "k": 2.0, "reward_mean": 0.5, "pass@1": 0.5, "pass@2": 0.6667, "eval_s": 1.5,
        "easy/prompts": 2.0, "easy/k": 2.0, "easy/reward_mean": 0.75, "easy/pass@1": 0.75, "easy/pass@2": 1.0,
        "hard/prompts": 1.0, "hard/k": 2.0, "hard/reward_mean": 0.0, "hard/pass@1": 0.0, "hard/pass@2": 0.0,
    }  # fmt: skip


def test_the_recorders_write_eval_goes_to_metrics_jsonl_tensorboard_and_wandb(tmp_path):
    """What the trainer hands EvalGate: one call that writes the eval record everywhere a step's goes
    (W&B: a stand-in for the sink, which tests/integration/test_wandb_offline.py checks for real)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlrun.rundir import RunDir
    from rlrun.telemetry.metrics import eval_records
    from rlrun.trainer.recorder import StepRecorder
    from rlrun.trainer.stopping import Stopping

    class Sink:
        def __init__(self) -> None:
            self.evals: list[dict] = []

        def log_eval(self, record) -> None:
            self.evals.append(dict(record))

        def close(self) -> None:
            pass

    cfg, _ = compose(["metrics.tensorboard=true"])
    run_dir = RunDir(Path(tmp_path))
    recorder = StepRecorder(cfg.metrics, run_dir, Stopping(FakeRedis({})), num_actors=cfg.actor.num_actors, max_train_steps=cfg.trainer.max_train_steps)
    recorder.wandb = sink = Sink()
    recorder.write_eval(EVAL)
    recorder.close()
    assert eval_records(run_dir.metrics) == [EVAL] and read_metrics(run_dir.metrics) == []  # an eval record, no step's
    assert sink.evals == [EVAL]
    events = EventAccumulator(str(run_dir.tensorboard))
    events.Reload()
    assert {"eval/pass@1", "eval/pass@2", "eval/reward_mean", "eval/easy/pass@1", "eval/hard/reward_mean"} <= set(events.Tags()["scalars"])
    assert [(e.step, e.value, e.wall_time) for e in events.Scalars("eval/easy/pass@1")] == [(4, 0.75, 1004.5)]
