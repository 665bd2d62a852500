"""trainer.nproc_per_node: validated against the step's passes, and turned into one supervised
rank group whose liveness wants every rank's heartbeat."""

from __future__ import annotations

import sys
import time

import pytest

from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.run.plan import build_plan
from rlrun.run.preflight import check_settings
from rlrun.run.built import build
from rlrun.parts.role_parts import RedisProbe
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.trainer.parallel import Ranks


def trainer_spec(tmp_path, *overrides):
    cfg, _ = compose(list(overrides))
    return next(spec for spec in build_plan(build(cfg), RunDir(tmp_path), preview=True).specs if spec.name == "trainer")


def test_one_rank_is_the_plain_trainer_process(tmp_path):
    assert trainer_spec(tmp_path).argv[:3] == [sys.executable, "-m", "rlrun.entrypoints.trainer"]


def test_two_ranks_are_one_supervised_rank_group(tmp_path):
    spec = trainer_spec(tmp_path, "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2")
    assert spec.argv[:6] == [sys.executable, "-m", "rlrun.entrypoints.rank_group", "--nproc", "2", "--"]
    assert spec.argv[6:9] == [sys.executable, "-m", "rlrun.entrypoints.trainer"]


def test_the_passes_must_split_evenly_over_the_ranks():
    cfg, _ = compose(["trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=3"])  # the hf trainer's rule: its backend's
    with pytest.raises(ConfigError, match=r"trainer.gradient_accumulation_passes \(3\) must be a multiple of trainer.nproc_per_node \(2\)"):
        check_settings(build(cfg))
    check_settings(build(compose(["trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=4"])[0]))
    with pytest.raises(ConfigError, match="trainer.nproc_per_node must be at least 1"):
        compose(["trainer.nproc_per_node=0"])


def test_fast_llm_ranks_are_set_in_its_own_block():
    with pytest.raises(ConfigError, match="trainer.nproc_per_node has no effect here: .*set trainer.fast_llm.nproc_per_node"):
        compose(["trainer=fast_llm", "trainer.device=cpu", "trainer.nproc_per_node=2"])


class FakeProbe(RedisProbe):
    def __init__(self, state: dict) -> None:
        super().__init__("", None)  # never connects: _ask answers
        self.state = state

    def _ask(self, action, default):  # heartbeat's hgetall of the trainer's state
        return self.state


def test_a_stuck_rank_is_no_sign_of_life():
    now = time.time()
    fresh = {"pid": "42", "heartbeat": now, names.rank_heartbeat(1): now, names.rank_heartbeat(2): now}
    others = (names.rank_heartbeat(1), names.rank_heartbeat(2))
    assert FakeProbe(fresh).heartbeat(names.TRAINER_STATE, 42, also=others)
    assert not FakeProbe({**fresh, names.rank_heartbeat(2): now - 60}).heartbeat(names.TRAINER_STATE, 42, also=others)
    assert not FakeProbe({k: v for k, v in fresh.items() if k != names.rank_heartbeat(1)}).heartbeat(names.TRAINER_STATE, 42, also=others)
    assert not FakeProbe(fresh).heartbeat(names.TRAINER_STATE, 43, also=others)  # another attempt's group


def test_a_rank_on_a_node_whose_clock_lags_ours_is_alive_while_its_heartbeat_moves():
    lag = 30.0  # rank 1's node: far more than the 5 s a heartbeat may be old
    others = (names.rank_heartbeat(1),)
    state = {"pid": "42", "heartbeat": time.time(), names.rank_heartbeat(1): time.time() - lag}
    probe = FakeProbe(state)
    assert not probe.heartbeat(names.TRAINER_STATE, 42, also=others)  # first sight: aged by the clocks
    seen = []
    for _ in range(3):
        state.update({"heartbeat": time.time(), names.rank_heartbeat(1): time.time() - lag})  # both beat on
        seen.append(probe.heartbeat(names.TRAINER_STATE, 42, also=others))
    assert seen == [True, True, True]
    time.sleep(0.05)  # then they stop: the same stamps read as old, however the clocks stand
    assert not probe.heartbeat(names.TRAINER_STATE, 42, also=others, max_age_s=0.02)


def test_each_rank_takes_its_local_ranks_gpu():
    ranks = Ranks.from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.2"})
    assert (ranks.rank, ranks.local_rank, ranks.world_size) == (3, 1, 4)
    assert ranks.device("cuda") == "cuda:1"
    assert ranks.device("cpu") == "cpu"
    one = Ranks.from_env({})
    assert (one.device("cuda"), one.device("cuda:2"), one.device("cpu")) == ("cuda", "cuda:2", "cpu")


def test_several_ranks_refuse_one_named_gpu():
    two_ranks = ["trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2"]
    with pytest.raises(ConfigError, match=r"trainer.device=cuda:1 names one GPU.*set trainer.device=cuda"):
        compose(["trainer.device=cuda:1", *two_ranks])
    cfg, _ = compose(["trainer.device=cuda", *two_ranks])
    assert cfg.trainer.device == "cuda"
    cfg, _ = compose(["trainer.device=cuda:1"])  # one rank: the named GPU
    assert cfg.trainer.device == "cuda:1"
