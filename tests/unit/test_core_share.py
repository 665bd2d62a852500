"""world.cpu_affinity=by_need: the actors' generation flags, the trainer's threads that follow them
layer by layer, the trainer's cores, and the settings it is refused with."""

from __future__ import annotations

import pytest
import torch

from rlrun.cluster.world import local_cores
from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.parts.generation_flags import GenerationFlags
from rlrun.trainer.core_share import ThreadsByNeed, blocks


def test_an_actors_flag_is_seen_through_another_mapping(tmp_path):
    path = tmp_path / "generating"
    actor0, actor1, trainer = (GenerationFlags(path, 2) for _ in range(3))
    assert not trainer.any_busy()  # a new file: nobody generating
    actor1.set(1, True)
    assert trainer.any_busy()
    actor0.set(0, True)
    actor1.set(1, False)
    assert trainer.any_busy()
    actor0.set(0, False)
    assert not trainer.any_busy()
    for flags in (actor0, actor1, trainer):
        flags.close()


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_follow_the_flags_before_each_block_forward_and_backward(threads_restored):
    torch.set_num_threads(1)
    busy = {"now": False}
    seen: list[int] = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)]))
    share = ThreadsByNeed(lambda: busy["now"], busy_threads=1, idle_threads=2)
    share.attach(model)

    for block in model[1]:  # runs after the share's own hook: the count the block computes with
        block.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))

    def run_blocks(x):
        for block in model[1]:
            x = block(x)
        return x

    out = run_blocks(model[0](torch.ones(2, 4, requires_grad=True)))
    assert seen == [2, 2, 2] and share.switches == 1  # idle vLLM: every core, set once
    busy["now"] = True
    out.sum().backward()  # the backward hooks see vLLM busy: back to trainer.threads
    assert torch.get_num_threads() == 1 and share.switches == 2


def test_blocks_are_the_longest_module_list():
    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(4)])
    model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2)]), layers)
    assert blocks(model) == list(layers)
    lone = torch.nn.Linear(2, 2)
    assert blocks(lone) == [lone]


def test_by_need_gives_the_trainer_every_core_and_the_servers_theirs():
    cfg = compose(["world.cpu_affinity=by_need"])[0]
    cores = local_cores(cfg, available={0, 1})
    assert cores["vllm-0"] == (0,) and cores[""] == (1,)  # as auto
    assert cores["trainer"] == (0, 1)
    auto = local_cores(compose([])[0], available={0, 1})
    assert "trainer" not in auto


@pytest.mark.parametrize("overrides", [["trainer.nproc_per_node=2"], ["trainer.device=cuda"]])
def test_by_need_is_refused_where_it_cannot_share(overrides):
    with pytest.raises(ConfigError, match="world.cpu_affinity=by_need lends"):
        compose(["world.cpu_affinity=by_need", *overrides])
