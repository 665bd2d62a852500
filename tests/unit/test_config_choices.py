"""What `world.cpu_affinity=auto` and `trainer.weight_transfer=auto` become (rlrun/config/choices.py):
the choice follows the run's shape, every process that loads the config makes the same one, and
an explicit value is never changed."""

import pytest
import yaml

from rlrun.cluster.world import local_cores
from rlrun.config.choices import resolve_auto
from rlrun.config.compose import compose, config_from_data


def chosen(*overrides: str) -> tuple[str, str]:
    cfg = compose(list(overrides))[0]
    return cfg.world.cpu_affinity, cfg.trainer.weight_transfer


def test_one_cpu_trainer_beside_its_servers_borrows_their_cores_and_shares_memory():
    assert chosen() == ("by_need", "shm")  # the default: world=local, trainer=hf on CPU, one rank
    assert chosen("recipe=smollm2_grpo") == ("by_need", "shm")
    assert local_cores(compose([])[0], available={0, 1})["trainer"] == (0, 1)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2"],
            ("split", "shm"),
        ),  # rank 0 writes the file
        (["trainer.device=cuda"], ("split", "disk")),  # GPU trainers: not measured on a GPU yet
        (["world=ray"], ("split", "disk")),  # the servers may be on other hosts
        (["world=slurm"], ("split", "disk")),
    ],
)
def test_elsewhere_auto_keeps_the_servers_cores_their_own_and_weights_on_disk(overrides, expected):
    assert chosen(*overrides) == expected


def test_an_explicit_choice_is_kept():
    assert chosen("world.cpu_affinity=split", "trainer.weight_transfer=disk") == ("split", "disk")
    assert chosen("world.cpu_affinity=none", "trainer.weight_transfer=broadcast") == ("none", "broadcast")


def test_a_role_file_and_a_saved_config_resolve_the_same_way():
    _, text = compose([])
    data = yaml.safe_load(text)
    assert data["world"]["cpu_affinity"] == "auto" and data["trainer"]["weight_transfer"] == "auto"  # saved as written
    loaded = config_from_data(data, source="config.yaml")
    assert (loaded.world.cpu_affinity, loaded.trainer.weight_transfer) == ("by_need", "shm")


def test_resolving_twice_changes_nothing():
    once = compose([])[0]  # resolved when loaded
    assert resolve_auto(once) == once
