"""A child's configuration error is not retried: rlrun's trainer, actor and weight follower exit 2
on a ConfigError, and the supervisor stops the run at once (exit 5) instead of spending the
restart budget (exit 6). Real processes, started from the specs `rlrun train` builds."""

from __future__ import annotations

import dataclasses
import time

import pytest
import yaml

from rlrun.config import compose
from rlrun.run.built import build
from rlrun.errors import ExitCode, ProcessFailed, RestartsExhausted
from rlrun.parts.role_parts import Endpoints
from rlrun.run.roles import build_specs
from rlrun.rundir import RunDir
from rlrun.supervisor import EventLog, RunVerdict, Supervisor

pytestmark = pytest.mark.timeout(180)


def _negative_lr(config: dict) -> None:
    config["trainer"]["lr"] = -1.0  # what every child reads back: invalid (a hand edit, a newer rlrun...)


def _cuda_without_a_gpu(config: dict) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: trainer.device=cuda is usable here")
    config["trainer"]["device"] = "cuda"  # valid, but not on this machine: a 4-crash exit 6 before issue 26


LR = (_negative_lr, "trainer.lr must be greater than 0")


@pytest.mark.parametrize("role, overrides, breakage", [
    ("trainer", [], LR), ("actor", [], LR),
    ("weights", ["trainer=fast_llm", "trainer.device=cpu", "supervisor.weights.backoff_initial_s=0"], LR),
    ("trainer", [], (_cuda_without_a_gpu, "trainer.device=cuda: torch sees 0 CUDA GPU(s) on this machine")),
], ids=["trainer", "actor", "weights", "trainer-device-not-here"])  # fmt: skip
def test_a_child_config_error_stops_the_run_at_once(tmp_path, role, overrides, breakage):
    cfg, resolved = compose(["supervisor.trainer.backoff_initial_s=0", "supervisor.actor.backoff_initial_s=0", *overrides])
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"kind": "rlrun-run"})
    broken = yaml.safe_load(resolved)
    breakage[0](broken)
    run_dir.config.write_text(yaml.safe_dump(broken))
    endpoints = Endpoints(redis_url="redis://127.0.0.1:1/0", redis_port=1, vllm_urls=["http://127.0.0.1:1"], broadcast_port=1)
    (spec,) = [s for s in build_specs(build(cfg), run_dir, endpoints, "/nonexistent-model", EventLog(None)) if s.name == role]
    assert spec.restart.restart and spec.restart.max_restarts == 3
    spec = dataclasses.replace(spec, after=())  # alone here: the processes it comes after are not
    supervisor = Supervisor([spec], EventLog(run_dir.events, clock=time.time), poll_interval_s=0.1)
    started = time.monotonic()
    with pytest.raises(ProcessFailed) as failed:
        try:
            supervisor.start_all()
            supervisor.watch(lambda exits: RunVerdict(False, "running"))
        finally:
            supervisor.stop_all()
    assert not isinstance(failed.value, RestartsExhausted) and failed.value.exit_code == ExitCode.PROCESS_FAILED
    assert breakage[1] in failed.value.log_tail and "Traceback" not in failed.value.log_tail
    assert "process_restarted" not in run_dir.events.read_text()
    assert time.monotonic() - started < 60  # no backoff, no second start
