"""world=ray without a cluster: the config, the bundles each process reserves, what a cluster
lacks (worded for a person), and world=local left exactly as it was."""

from __future__ import annotations

import sys

import pytest

from rlrun.cluster import placement
from rlrun.cluster.world import process_names, spawner_for
from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.launch import plan_specs
from rlrun.rundir import RunDir
from rlrun.supervisor.local import LocalSpawner

RAY = ["world=ray", "world.address=10.0.0.1:6379"]


def test_world_local_is_the_default_and_gets_the_local_spawner(tmp_path):
    cfg, resolved = compose([])
    assert cfg.world.kind == "local"
    assert "world:\n  kind: local\n" in resolved  # nothing new in a local run's saved config
    before = "ray" in sys.modules
    assert isinstance(spawner_for(cfg, RunDir(tmp_path)), LocalSpawner)
    assert ("ray" in sys.modules) == before  # Ray is not imported for world=local


def test_world_ray_bundles_follow_the_config():
    cfg, _ = compose([*RAY, "world.vllm.cpus=0", "world.vllm.gpus=1", "world.vllm.resources={vllm_node: 1}",
                      "world.trainer.resources={trainer_node: 2}", "inference.num_servers=2"])  # fmt: skip
    assert placement.bundles(cfg.world, process_names(cfg)) == {
        "redis": {},  # stays with the supervisor
        "vllm-0": {"GPU": 1.0, "vllm_node": 1.0},
        "vllm-1": {"GPU": 1.0, "vllm_node": 1.0},
        "trainer": {"CPU": 1.0, "trainer_node": 2.0},
        "actor": {"CPU": 1.0},
    }


@pytest.mark.parametrize(
    "overrides",
    [[], RAY, [*RAY, "inference.num_servers=3"], [*RAY, "streams.url=redis://10.0.0.2:6379/0"],
     [*RAY, "trainer=fast_llm", "trainer.device=cpu", "inference.num_servers=2"],
     ["actor.num_actors=2", "inference.num_servers=3"]],
)
def test_process_names_are_the_ones_the_roles_build(overrides, tmp_path):
    cfg, _ = compose(overrides)
    assert process_names(cfg) == [spec.name for spec in plan_specs(cfg, RunDir(tmp_path))]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["world=ray", "world.address=null"], ["world.address must name the Ray cluster", "auto"]),
        ([*RAY, "world.actor.cpus=0"], ["world.actor reserves no Ray resource", "world.actor.local=true"]),
        ([*RAY, "world.vllm.gpus=-1"], ["world.vllm: Ray resources cannot be negative"]),
        ([*RAY, "world.placement_timeout_s=0"], ["world.placement_timeout_s must be positive"]),
        (["world=mars"], ["unknown world 'mars'", "local, ray"]),
    ],
)
def test_bad_world_settings_are_named(overrides, expected):
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    for fragment in expected:
        assert fragment in str(info.value)


def test_a_role_with_no_resources_but_local_is_valid():
    cfg, _ = compose([*RAY, "world.actor.cpus=0", "world.actor.local=true"])
    assert placement.bundles(cfg.world, ["actor"]) == {"actor": {}}


NODES = {
    "10.0.0.1 (aaaa)": {"CPU": 8.0, "GPU": 2.0, "memory": 1e10, "node:10.0.0.1": 1.0},
    "10.0.0.2 (bbbb)": {"CPU": 8.0, "vllm_node": 1.0},
}


def test_a_cluster_that_can_hold_the_run_lacks_nothing():
    wanted = {"redis": {}, "vllm-0": {"CPU": 1.0, "vllm_node": 1.0}, "trainer": {"GPU": 2.0}, "actor": {"CPU": 1.0}}
    assert placement.shortfall(wanted, NODES) == []


def test_what_is_missing_is_named_per_process_and_in_total():
    wanted = {
        "vllm-0": {"GPU": 1.0, "vllm_node": 1.0},  # GPUs and vllm_node are on different nodes
        "vllm-1": {"vllm_node": 1.0},
        "trainer": {"GPU": 4.0},  # no node has 4
    }
    problems = placement.shortfall(wanted, NODES)
    assert problems == [
        "vllm-0 needs GPU 1, vllm_node 1 on one node, and no node has that",
        "trainer needs GPU 4 on one node, and no node has that",
        "GPU: 5 needed in all (vllm-0, trainer), the cluster has 2",
        "vllm_node: 2 needed in all (vllm-0, vllm-1), the cluster has 1",
    ]


def test_node_descriptions_leave_out_bookkeeping_resources():
    assert placement.describe_nodes(NODES) == "10.0.0.1 (aaaa): CPU 8, GPU 2; 10.0.0.2 (bbbb): CPU 8, vllm_node 1"
    assert placement.describe_nodes({}) == "no node alive"


def test_role_of_a_process():
    assert [placement.role_of(n) for n in ("redis", "vllm-0", "vllm-12", "trainer", "actor")] == [
        "redis", "vllm", "vllm", "trainer", "actor",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no placement for process 'judge'"):
        placement.role_of("judge")


def test_the_fast_llm_weight_follower_is_placed_like_the_actor():
    from rlrun.cluster.world import process_names
    from rlrun.config import compose

    cfg, _ = compose(["trainer=fast_llm", "trainer.device=cpu", "world=ray", "world.actor.cpus=0.5"])
    names = process_names(cfg)
    assert names.index("weights") < names.index("trainer")  # the trainer waits for it at start
    assert placement.role_of("weights") == "actor"
    assert placement.bundles(cfg.world, names)["weights"] == placement.bundles(cfg.world, names)["actor"]
    assert "weights" not in process_names(compose(["world=ray"])[0])  # hf: no follower


def test_an_actor_shares_the_bundle_and_node_of_its_first_vllm_server():
    from rlrun.cluster.world import actor_anchors

    cfg, _ = compose([*RAY, "actor.num_actors=2", "inference.num_servers=3", "world.vllm.gpus=1", "world.vllm.cpus=0"])
    anchors = actor_anchors(cfg)
    assert anchors == {"actor-0": "vllm-0", "actor-1": "vllm-1"}
    reserved, owner = placement.colocate(placement.bundles(cfg.world, process_names(cfg)), anchors)
    assert reserved == {  # one bundle per node-sharing set: the actors' CPUs ride with their servers
        "vllm-0": {"CPU": 1.0, "GPU": 1.0},
        "vllm-1": {"CPU": 1.0, "GPU": 1.0},
        "vllm-2": {"GPU": 1.0},
        "trainer": {"CPU": 1.0},
    }
    assert owner == {"vllm-0": "vllm-0", "vllm-1": "vllm-1", "vllm-2": "vllm-2", "trainer": "trainer",
                     "actor-0": "vllm-0", "actor-1": "vllm-1"}  # fmt: skip


def test_colocation_needs_both_placed_by_ray():
    bundles = {"vllm-0": {}, "actor": {"CPU": 1.0}}  # the server runs locally: nothing to share
    reserved, owner = placement.colocate(bundles, {"actor": "vllm-0"})
    assert reserved == {"actor": {"CPU": 1.0}} and owner == {"actor": "actor"}


def test_a_trainer_of_several_ranks_reserves_its_cpus_and_gpus_per_rank_on_one_node():
    from rlrun.cluster.world import process_ranks

    cfg, _ = compose([*RAY, "trainer.nproc_per_node=4", "trainer.gradient_accumulation_passes=4", "world.trainer.gpus=1",
                      "world.trainer.cpus=2", "world.trainer.resources={trainer_node: 1}"])  # fmt: skip
    assert process_ranks(cfg) == {"trainer": 4}
    bundles = placement.bundles(cfg.world, process_names(cfg), process_ranks(cfg))
    assert bundles["trainer"] == {"CPU": 8.0, "GPU": 4.0, "trainer_node": 1.0}  # the node picker once
    assert bundles["actor"] == {"CPU": 1.0}  # one rank: as before
    nodes = {"a": {"CPU": 16.0, "GPU": 2.0, "trainer_node": 1.0}, "b": {"CPU": 16.0, "GPU": 2.0}}
    assert placement.shortfall({"trainer": bundles["trainer"]}, nodes) == [
        "trainer needs CPU 8, GPU 4, trainer_node 1 on one node, and no node has that"
    ]


def test_the_dry_run_shows_each_rank_and_where_it_goes():
    from rlrun.cluster.world import placement_rows

    cfg, _ = compose([*RAY, "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2", "world.trainer.gpus=1",
                      "inference.num_servers=2"])  # fmt: skip
    rows = {row[0]: row[1:] for row in placement_rows(cfg)}
    assert rows["trainer"] == ("rank 0, rank 1", "CPU 2, GPU 2 (CPU 1, GPU 1 per rank)", "a node Ray picks for this bundle; all 2 ranks on it")
    assert rows["redis"][2].startswith("this machine") and rows["actor"][2] == "the node of vllm-0 (one bundle with it)"
    assert rows["vllm-1"] == ("-", "CPU 1", "a node Ray picks for this bundle")
