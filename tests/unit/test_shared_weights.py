"""trainer.weight_transfer=shm's file (rlrun/weights/shared.py): what the trainer writes is what a
reader's views hold, step after step, in one mapping laid out once; a restarted trainer's new file is
mapped again; tied tensors are written once; too little shared memory is a clear error; and the key's
validation (hf trainer, world=local)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.weights import shared
from rlrun.weights.shared import SharedReader, SharedWeights, shared_path, without_aliases


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"embed.weight": torch.randn(37, 16, generator=g), "norm.weight": torch.ones(3) * step,
            "up.weight": torch.randn(8, 5, generator=g).bfloat16(), "head.weight": torch.randn(37, 16, generator=g).half()}  # fmt: skip


def test_a_reader_sees_each_steps_weights_in_one_mapping(tmp_path):
    path = shared_path("run-0123456789abcdef/", tmp_path)
    writer, reader = SharedWeights(path), SharedReader()
    assert path.name == "rlrun-run-0123456789abcdef-weights"
    for step in (1, 2):
        written = writer.write(state(step))
        assert written == sum(t.numel() * t.element_size() for t in state(step).values())
        got = dict(reader.tensors(str(path)))
        assert list(got) == list(state(step))
        for name, tensor in state(step).items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), (step, name)
            assert got[name].data_ptr() % shared.ALIGN == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # the run's user alone
    with pytest.raises(ValueError, match="layout"):
        writer.write({**state(3), "extra.weight": torch.ones(2)})
    restarted = SharedWeights(path)  # a restarted trainer makes the file anew: the reader maps the new one
    restarted.write(state(4))
    assert torch.equal(dict(reader.tensors(str(path)))["norm.weight"], torch.ones(3) * 4)
    restarted.close()
    assert not path.exists() and not shared.layout_path(path).exists()


def test_tied_tensors_are_written_once_and_copies_are_not_ties():
    embed = torch.randn(4, 3)
    kept = without_aliases({"embed.weight": embed, "head.weight": embed, "norm.weight": torch.ones(3)})
    assert list(kept) == ["embed.weight", "norm.weight"]
    assert list(without_aliases({"a": embed, "b": embed.clone()})) == ["a", "b"]


def test_too_little_shared_memory_is_a_config_error_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(shared.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1_000_000})())
    with pytest.raises(ConfigError, match=r"has 1 MB free, the weights need 2 MB.*--shm-size.*trainer.weight_transfer=disk"):
        SharedWeights(tmp_path / "w").write({"w": torch.ones(500_000)})


def test_shm_is_the_hf_trainers_choice_on_one_host():
    cfg, _ = compose(["recipe=math_grpo", "trainer.weight_transfer=shm", "inference.tensor_parallel_size=2"])
    assert cfg.trainer.weight_transfer == "shm"  # every worker of a server maps the file: no one-rank rule
    for refused in (["world=ray"], ["trainer=fast_llm"]):
        with pytest.raises(ConfigError, match="trainer.weight_transfer=shm"):
            compose(["recipe=math_grpo", "trainer.weight_transfer=shm", *refused])


def test_the_trainer_copies_each_steps_weights_before_the_update_and_a_folder_only_for_a_cold_start(tmp_path):
    """WeightPublisher with trainer.weight_transfer=shm: the servers are asked to load the file
    once it holds the step's weights (the tied head once); an update that fails leaves the step's
    folder in weights/current for a server that starts cold, as the broadcast does."""
    import threading

    from rlrun.config.schema import TrainerConfig
    from rlrun.rundir import RunDir
    from rlrun.streams import names
    from rlrun.trainer.parallel import Parallel, Ranks
    from rlrun.trainer.weight_publisher import WeightPublisher
    from tests.unit.test_overlapped_weight_update import Model, Redis

    class Servers:
        def __init__(self) -> None:
            self.loaded, self.fail = [], False

        def update_from_shared(self, path, version, publish):
            if self.fail:
                raise RuntimeError("vLLM http://127.0.0.1:1/update_weights answered 500")
            self.loaded.append((version, {name: t.clone() for name, t in SharedReader().tensors(path)}))
            publish()
            return []

    servers, redis, run = Servers(), Redis(), RunDir(tmp_path / "run")
    run.weights.mkdir(parents=True)
    publisher = WeightPublisher(TrainerConfig(weight_transfer="shm", checkpoint_every=10, max_train_steps=100), run, redis, servers,
                                Parallel(Ranks()), None, threading.Event(), lambda **_: None, vllm_wait_s=0.0,
                                shared=SharedWeights(tmp_path / "weights"))  # fmt: skip
    model = Model()
    with torch.no_grad():
        model.weight.fill_(3.0)
    publisher.push(model, version=1, step=1)
    assert [v for v, _ in servers.loaded] == [1] and torch.equal(servers.loaded[0][1]["weight"], torch.full((1, 3), 3.0))
    assert redis.strings[names.POLICY_VERSION] == 1 and not run.current_weights.exists()  # no folder per step
    servers.fail = True
    with pytest.raises(RuntimeError, match="answered 500"):
        publisher.push(model, version=2, step=2)
    assert run.current_weights.resolve() == run.weights_version(2).resolve()  # for a server that starts cold
