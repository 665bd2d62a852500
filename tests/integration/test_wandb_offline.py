"""metrics.wandb=true in W&B's offline mode (nothing leaves the machine): the offline run files
hold the step scalars, the supervisor's failure/restart events and the resolved config, and a
second sink for the same run directory (a restarted trainer, `rlrun resume`) continues the same
W&B run."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from rlrun.rundir import RunDir

import wandb  # noqa: E402 - in the `test` extra: this test always runs


def offline_records(run_file: Path):
    """The protobuf records of a .wandb file (a LevelDB-style log after a 7-byte W&B header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        parts = chunk if kind in (1, 2) else parts + chunk  # FULL/FIRST start a record, MIDDLE/LAST extend it
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


def history(run_file: Path) -> list[dict]:
    import json

    rows = []
    for record in offline_records(run_file):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def test_offline_files_hold_the_scalars_the_events_and_the_config_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    from rlrun.telemetry.wandb_sink import WandbSink

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    run_dir.config.write_text("trainer:\n  max_train_steps: 3\nalgo:\n  name: grpo\n")
    t = time.time()
    started = {"time": t, "event": "run_started"}
    failed = {"time": t + 1.5, "event": "process_failed", "process": "actor", "reason": "killed by SIGKILL", "action": "restart"}
    restarted = {"time": t + 1.6, "event": "process_restarted", "process": "actor", "attempt": 1}

    sink = WandbSink(run_dir, "rlrun-test", "offline")
    sink.log({"step": 1, "time": t + 1, "reward_mean": 0.25, "ettr": 0.5, "loss": 0.1}, [started])
    sink.log({"step": 2, "time": t + 2, "reward_mean": 0.5, "ettr": 0.6, "loss": 0.2}, [started, failed, restarted])
    sink.close()
    # A restarted trainer: the same W&B run, and the events already sent are not sent again.
    again = WandbSink(run_dir, "rlrun-test", "offline", last_step_time=t + 2)
    again.log({"step": 3, "time": t + 3, "reward_mean": 0.75, "ettr": 0.7, "loss": 0.3}, [started, failed, restarted])
    again.close()

    run_files = sorted((run_dir.root / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 2
    run_id = (run_dir.root / "wandb-run-id").read_text().strip()
    assert all(f.name == f"run-{run_id}.wandb" for f in run_files)  # one W&B run, continued

    first, second = history(run_files[0]), history(run_files[1])
    assert [(r["_step"], r["reward_mean"], r["ettr"]) for r in first] == [(1, 0.25, 0.5), (2, 0.5, 0.6)]
    assert first[0]["supervisor/failures"] == 0 and "supervisor/event" not in first[0]
    assert (first[1]["supervisor/failures"], first[1]["supervisor/restarts"]) == (1, 1)
    assert first[1]["supervisor/event"] == "process_failed actor: killed by SIGKILL\nprocess_restarted actor"
    assert [(r["_step"], r["reward_mean"]) for r in second] == [(3, 0.75)] and "supervisor/event" not in second[0]

    runs = [r.run for f in run_files for r in offline_records(f) if r.WhichOneof("record_type") == "run"]
    config = {item.key: item.value_json for item in runs[0].config.update}
    assert runs[0].project == "rlrun-test" and runs[0].run_id == run_id and '"max_train_steps":3' in config["trainer"]


def test_evaluations_are_eval_scalars_over_the_policy_version_and_none_is_dropped(tmp_path, monkeypatch):
    """An evaluation goes in at its version's step; one recorded after a later step (an overlapped
    weight update) goes in at that step, not behind it, where W&B would drop it."""
    from rlrun.telemetry.wandb_sink import EVAL_X, WandbSink

    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    t = time.time()
    per_source = {"easy": {"prompts": 1, "k": 1, "reward_mean": 1.0, "pass@1": 1.0, "correct": [1]}}

    def evaluation(version: int, pass_at_1: float) -> dict:
        return {"kind": "eval", "step": version, "policy_version": version, "prompts": 2, "k": 1, "reward_mean": pass_at_1,
                "pass@1": pass_at_1, "correct": [1, 0], "per_source": per_source, "eval_s": 0.5, "time": t + version}  # fmt: skip

    sink = WandbSink(run_dir, "rlrun-test", "offline")
    sink.log_eval(evaluation(0, 0.0))  # the weights training starts from, before any step
    sink.log({"step": 1, "time": t + 1, "reward_mean": 0.25})
    sink.log({"step": 2, "time": t + 2, "reward_mean": 0.5})
    sink.log_eval(evaluation(2, 0.5))  # while step 2's row is open
    sink.log({"step": 3, "time": t + 3, "reward_mean": 0.75})
    sink.log({"step": 4, "time": t + 4, "reward_mean": 0.8})
    sink.log_eval(evaluation(3, 0.75))  # after step 4's record
    sink.close()

    (run_file,) = (run_dir.root / "wandb").glob("offline-run-*/run-*.wandb")
    rows = history(run_file)
    evals = [(r["_step"], r[EVAL_X], r["eval/pass@1"], r["eval/easy/pass@1"]) for r in rows if EVAL_X in r]
    assert evals == [(0, 0, 0.0, 1.0), (2, 2, 0.5, 1.0), (4, 3, 0.75, 1.0)]
    assert [(r["_step"], r["reward_mean"]) for r in rows if "reward_mean" in r] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 0.8)]
    assert not any("eval/correct" in r or "eval/step" in r for r in rows)  # per-prompt counts and the step are no scalars
    metrics = {r.metric.glob_name or r.metric.name: r.metric.step_metric for r in offline_records(run_file) if r.WhichOneof("record_type") == "metric"}
    assert metrics.get("eval/*") == EVAL_X
