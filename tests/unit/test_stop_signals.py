"""What a signal means to a running `rlrun train` (rlrun/run/stop_signals.py): the first one stops
the run in order, later ones do not cut that short; in a SLURM job the job's fate is said at SIGTERM
and kept over the "interrupted" the orderly stop writes; the time-limit signal requeues."""

from __future__ import annotations

import pytest

from rlrun.cluster import slurm_job
from rlrun.config import compose
from rlrun.errors import RestartsExhausted
from rlrun.run.built import build
from rlrun.run.stop_signals import StopSignals
from rlrun.rundir import RunDir, read_jsonl

JOB = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node0"}


def _signals(tmp_path, environ, *overrides) -> StopSignals:
    cfg, _ = compose(list(overrides))
    run = RunDir(tmp_path / "run")
    run.create({"kind": "rlrun-run"})
    run.slurm.mkdir()
    return StopSignals.of(build(cfg), run, environ)


def test_outside_slurm_only_sigterm_stops_the_run_and_only_the_first_counts(tmp_path):
    stops = _signals(tmp_path, JOB)  # world=local: a SLURM job around it changes nothing
    assert stops.job is None and stops.names == ("TERM",)
    stops.started()
    assert not stops.run_dir.events.exists()  # nothing recorded outside a job
    assert stops.received_signal("TERM") and not stops.received_signal("TERM")


def test_in_a_job_sigterm_says_why_at_once_and_that_survives_the_orderly_stop(tmp_path):
    stops = _signals(tmp_path, JOB, "world=slurm")
    assert stops.names == ("TERM", slurm_job.TIME_LIMIT_SIGNAL)
    stops.started()
    stops.run_dir.slurm_output("77").write_text("*** JOB 77 ON node0 CANCELLED AT 2026-12-03T05:29:01 ***\n")
    assert stops.received_signal("TERM")
    assert stops.run_dir.read_state()["status"] == "cancelled"
    stops.run_dir.write_state(status="interrupted")  # what launch.train writes as it stops
    outcome = stops.after_stop()
    assert (outcome.status, outcome.requeued) == ("cancelled", False)
    assert stops.run_dir.read_state()["status"] == "cancelled"
    events = [e["event"] for e in read_jsonl(stops.run_dir.events)]
    assert events == ["slurm_job_started", "slurm_job_stopped"]  # said once, at the signal


def test_the_time_limit_signal_requeues_the_job_after_the_stop(tmp_path, monkeypatch):
    requeued: list[str] = []
    monkeypatch.setattr(slurm_job, "requeue", requeued.append)
    stops = _signals(tmp_path, JOB, "world=slurm")
    stops.started()
    assert stops.received_signal(slurm_job.TIME_LIMIT_SIGNAL) and requeued == []  # nothing before the stop
    outcome = stops.after_stop()
    assert outcome.requeued and requeued == ["77"] and stops.run_dir.read_state()["status"] == "requeued"


def test_a_requeue_loop_without_progress_ends_the_job(tmp_path):
    stops = _signals(tmp_path, {**JOB, "SLURM_RESTART_COUNT": "1"}, "world=slurm", "world.max_starts_without_progress=1")
    stops.received_signal(slurm_job.TIME_LIMIT_SIGNAL)
    slurm_job.record_start(stops.run_dir, slurm_job.JobEnv("77", 0, "node0", ""), stops.built.cfg.world, 0)
    with pytest.raises(RestartsExhausted, match="without a new checkpoint"):
        stops.after_stop()
