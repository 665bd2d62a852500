"""world=ray without a cluster: the config, the bundles each process reserves, what a cluster
lacks (worded for a person), and world=local left exactly as it was."""

from __future__ import annotations

import sys

import pytest

from rlrun.cluster import placement
from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.run.plan import build_plan
from rlrun.run.built import build
from rlrun.rundir import RunDir
from rlrun.supervisor.local import LocalSpawner

RAY = ["world=ray", "world.address=10.0.0.1:6379"]


def test_world_local_is_the_default_and_gets_the_local_spawner(tmp_path):
    cfg, resolved = compose([])
    assert cfg.world.kind == "local"
    assert "world:\n  kind: local\n" in resolved  # nothing new in a local run's saved config
    before = "ray" in sys.modules
    assert isinstance(build(cfg).world.spawner(RunDir(tmp_path)), LocalSpawner)
    assert ("ray" in sys.modules) == before  # Ray is not imported for world=local


def test_world_ray_bundles_follow_the_config():
    cfg, _ = compose([*RAY, "world.vllm.cpus=0", "world.vllm.gpus=1", "world.vllm.resources={vllm_node: 1}",
                      "world.trainer.resources={trainer_node: 2}", "inference.num_servers=2"])  # fmt: skip
    assert placement.bundles(cfg.world, build(cfg).world.process_names()) == {
        "redis": [],  # stays with the supervisor
        "vllm-0": [{"GPU": 1.0, "vllm_node": 1.0}],
        "vllm-1": [{"GPU": 1.0, "vllm_node": 1.0}],
        "trainer": [{"CPU": 1.0, "trainer_node": 2.0}],
        "actor": [{"CPU": 1.0}],
    }


@pytest.mark.parametrize(
    "overrides",
    [[], RAY, [*RAY, "inference.num_servers=3"], [*RAY, "streams.url=redis://10.0.0.2:6379/0"],
     [*RAY, "trainer=fast_llm", "trainer.device=cpu", "inference.num_servers=2"],
     ["actor.num_actors=2", "inference.num_servers=3"]],
)
def test_process_names_are_the_ones_the_roles_build(overrides, tmp_path):
    cfg, _ = compose(overrides)
    assert build(cfg).world.process_names() == [spec.name for spec in build_plan(build(cfg), RunDir(tmp_path), preview=True).specs]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["world=ray", "world.address=null"], ["world.address must name the Ray cluster", "auto"]),
        ([*RAY, "world.actor.cpus=0"], ["world.actor reserves no Ray resource", "world.actor.local=true"]),
        ([*RAY, "world.vllm.gpus=-1"], ["world.vllm.gpus must be 0 or more", "got -1"]),
        ([*RAY, "world.placement_timeout_s=0"], ["world.placement_timeout_s must be greater than 0"]),
        (["world=mars"], ["unknown world 'mars'", "local, ray, slurm"]),
    ],
)
def test_bad_world_settings_are_named(overrides, expected):
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    for fragment in expected:
        assert fragment in str(info.value)


def test_a_role_with_no_resources_but_local_is_valid():
    cfg, _ = compose([*RAY, "world.actor.cpus=0", "world.actor.local=true"])
    assert placement.bundles(cfg.world, ["actor"]) == {"actor": []}


NODES = {
    "10.0.0.1 (aaaa)": {"CPU": 8.0, "GPU": 2.0, "memory": 1e10, "node:10.0.0.1": 1.0},
    "10.0.0.2 (bbbb)": {"CPU": 8.0, "vllm_node": 1.0},
}


def test_a_cluster_that_can_hold_the_run_lacks_nothing():
    wanted = {"redis": [], "vllm-0": [{"CPU": 1.0, "vllm_node": 1.0}], "trainer": [{"GPU": 1.0}] * 2, "actor": [{"CPU": 1.0}]}
    assert placement.shortfall(wanted, NODES) == []


def test_what_is_missing_is_named_per_process_and_in_total():
    wanted = {
        "vllm-0": [{"GPU": 1.0, "vllm_node": 1.0}],  # GPUs and vllm_node are on different nodes
        "vllm-1": [{"vllm_node": 1.0}],
        "trainer": [{"GPU": 4.0}],  # no node has 4
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
    from rlrun.config import compose

    cfg, _ = compose(["trainer=fast_llm", "trainer.device=cpu", "world=ray", "world.actor.cpus=0.5"])
    names = build(cfg).world.process_names()
    assert names.index("weights") < names.index("trainer")  # the trainer waits for it at start
    assert placement.role_of("weights") == "actor"
    assert placement.bundles(cfg.world, names)["weights"] == placement.bundles(cfg.world, names)["actor"] == [{"CPU": 0.5}]
    assert "weights" not in build(compose(["world=ray"])[0]).world.process_names()  # hf: no follower


def test_an_actor_shares_the_bundle_and_node_of_its_first_vllm_server():
    from rlrun.cluster.world import actor_anchors

    cfg, _ = compose([*RAY, "actor.num_actors=2", "inference.num_servers=3", "world.vllm.gpus=1", "world.vllm.cpus=0"])
    anchors = actor_anchors(cfg)
    assert anchors == {"actor-0": "vllm-0", "actor-1": "vllm-1"}
    reserved, owner = placement.colocate(placement.bundles(cfg.world, build(cfg).world.process_names()), anchors)
    assert reserved == {  # one bundle per node-sharing set: the actors' CPUs ride with their servers
        "vllm-0": [{"CPU": 1.0, "GPU": 1.0}],
        "vllm-1": [{"CPU": 1.0, "GPU": 1.0}],
        "vllm-2": [{"GPU": 1.0}],
        "trainer": [{"CPU": 1.0}],
    }
    assert owner == {"vllm-0": "vllm-0", "vllm-1": "vllm-1", "vllm-2": "vllm-2", "trainer": "trainer",
                     "actor-0": "vllm-0", "actor-1": "vllm-1"}  # fmt: skip


def test_colocation_needs_both_placed_by_ray():
    bundles = {"vllm-0": [], "actor": [{"CPU": 1.0}]}  # the server runs locally: nothing to share
    reserved, owner = placement.colocate(bundles, {"actor": "vllm-0"})
    assert reserved == {"actor": [{"CPU": 1.0}]} and owner == {"actor": "actor"}


def test_a_trainer_of_several_ranks_reserves_one_bundle_per_rank():
    cfg, _ = compose([*RAY, "trainer.nproc_per_node=4", "trainer.gradient_accumulation_passes=4", "world.trainer.gpus=1",
                      "world.trainer.cpus=2", "world.trainer.resources={trainer_node: 1}"])  # fmt: skip
    world = build(cfg).world
    assert world.process_ranks() == {"trainer": 4} and world.spread_processes() == {"trainer"}
    bundles = world.bundles()
    # CPUs, GPUs and the node picker per rank: each rank's bundle may land on another node
    assert bundles["trainer"] == [{"CPU": 2.0, "GPU": 1.0, "trainer_node": 1.0}] * 4
    assert bundles["actor"] == [{"CPU": 1.0}]  # one rank: as before
    # a node offering {trainer_node: 1} takes one rank: 4 need 4 such nodes, or one offering 4
    nodes = {"a": {"CPU": 16.0, "GPU": 2.0, "trainer_node": 1.0}, "b": {"CPU": 16.0, "GPU": 2.0, "trainer_node": 1.0}}
    assert placement.shortfall({"trainer": bundles["trainer"]}, nodes) == [
        "trainer_node: 4 needed in all (trainer: 4 ranks), the cluster has 2"
    ]
    assert placement.shortfall({"trainer": bundles["trainer"]}, {**nodes, "c": {"CPU": 4.0, "GPU": 2.0, "trainer_node": 2.0}}) == []
    assert placement.shortfall({"trainer": [{"GPU": 3.0}] * 2}, nodes) == [
        "trainer needs GPU 3 on one node for each of its 2 ranks, and no node has that",
        "GPU: 6 needed in all (trainer: 2 ranks), the cluster has 4",
    ]


def test_fast_llm_ranks_stay_on_one_node_in_one_bundle():
    """Its launch command (torchrun) is the user's: rlrun cannot start it per node."""

    cfg, _ = compose([*RAY, "trainer=fast_llm", "trainer.device=cpu", "trainer.fast_llm.nproc_per_node=4", "world.trainer.gpus=1",
                      "world.trainer.resources={trainer_node: 1}"])  # fmt: skip
    assert build(cfg).world.spread_processes() == frozenset()
    assert build(cfg).world.bundles()["trainer"] == [{"CPU": 4.0, "GPU": 4.0, "trainer_node": 1.0}]  # the node picker once
    nodes = {"a": {"CPU": 16.0, "GPU": 2.0, "trainer_node": 1.0}, "b": {"CPU": 16.0, "GPU": 2.0}}
    assert placement.shortfall({"trainer": build(cfg).world.bundles()["trainer"]}, nodes) == [
        "trainer needs CPU 4, GPU 4, trainer_node 1 on one node, and no node has that"
    ]


@pytest.mark.parametrize(
    "bundle_nodes, expected",
    [
        (["A"], [("A", 0, 0, 1)]),
        (["A", "A", "A"], [("A", 0, 0, 3)]),
        (["A", "B"], [("A", 0, 0, 1), ("B", 1, 1, 1)]),
        # ranks are numbered per node, contiguously, rank 0 on the first bundle's node
        (["B", "A", "B", "C", "A"], [("B", 0, 0, 2), ("A", 1, 2, 2), ("C", 2, 4, 1)]),
    ],
)
def test_the_ranks_are_grouped_by_node_and_numbered_per_node(bundle_nodes, expected):
    layout = placement.node_ranks(bundle_nodes)
    assert [(g.node, g.node_rank, g.first_rank, g.nproc) for g in layout] == expected
    ranks = [r for g in layout for r in range(g.first_rank, g.first_rank + g.nproc)]
    assert ranks == list(range(len(bundle_nodes)))  # every rank once, the world as wide as the bundles


def test_the_dry_run_shows_each_rank_its_bundle_and_that_placement_picks_the_node():
    cfg, _ = compose([*RAY, "trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=2", "world.trainer.gpus=1",
                      "world.trainer.resources={trainer_node: 1}", "inference.num_servers=2"])  # fmt: skip
    rows = build(cfg).world.placement_rows()
    trainer = [row[1:] for row in rows if row[0] == "trainer"]
    assert trainer == [
        ("rank 0", "CPU 1, GPU 1, trainer_node 1", "a node Ray picks for this rank's bundle (rank 0's node: the ranks' rendezvous)"),
        ("rank 1", "CPU 1, GPU 1, trainer_node 1", "a node Ray picks for this rank's bundle; with the other ranks on that node, one rank group"),
    ]
    others = {row[0]: row[1:] for row in rows if row[0] != "trainer"}
    assert others["redis"] == ("-", "nothing", "this machine, beside the supervisor (not placed by Ray)")
    assert others["actor"] == ("-", "CPU 1", "the node of vllm-0 (one bundle with it)")
    assert others["vllm-1"] == ("-", "CPU 1", "a node Ray picks for this bundle")


def test_the_dry_run_of_fast_llm_ranks_shows_them_on_one_node():
    cfg, _ = compose([*RAY, "trainer=fast_llm", "trainer.device=cpu", "trainer.fast_llm.nproc_per_node=2", "world.trainer.gpus=1"])
    rows = {row[0]: row[1:] for row in build(cfg).world.placement_rows()}
    assert rows["trainer"] == ("rank 0, rank 1", "CPU 2, GPU 2 (CPU 1, GPU 1 per rank)", "a node Ray picks for this bundle; all 2 ranks on it")


# --- world=local: the CPU cores of each process (rlrun/cluster/cores.py) -----------------------------
from rlrun.cluster.cores import cores_by_process, split_cores  # noqa: E402


def test_on_two_cores_vllm_gets_one_and_everything_else_the_other():
    assert split_cores([0, 1], servers=1, threads_per_server=1) == ([(0,)], (1,))
    assert cores_by_process({1, 0}, ["vllm-0"], 1) == {"vllm-0": (0,), "": (1,)}


def test_a_server_gets_its_threads_and_two_more_while_one_core_is_left():
    assert split_cores(range(8), servers=1, threads_per_server=1) == ([(0, 1, 2)], (3, 4, 5, 6, 7))
    assert split_cores(range(4), servers=1, threads_per_server=4) == ([(0, 1, 2)], (3,))  # one left for the rest
    assert split_cores(range(7), servers=2, threads_per_server=1) == ([(0, 1, 2), (3, 4, 5)], (6,))
    assert split_cores([3, 5, 9], servers=2, threads_per_server=1) == ([(3,), (5,)], (9,))  # the cores rlrun may use


def test_too_few_cores_to_give_every_server_one_and_keep_one_pins_nothing():
    assert split_cores([0], servers=1, threads_per_server=1) is None
    assert split_cores([0, 1], servers=2, threads_per_server=1) is None
    assert cores_by_process([0, 1], ["vllm-0", "vllm-1"], 1) == {}


def test_the_run_asks_for_pinning_by_default_and_can_turn_it_off():
    from rlrun.cluster.world import local_cores
    from rlrun.config import compose
    from rlrun.errors import ConfigError

    assert local_cores(compose([])[0], {0, 1}) == {"vllm-0": (0,), "": (1,)}
    assert local_cores(compose(["world.cpu_affinity=none"])[0], {0, 1}) == {}
    with pytest.raises(ConfigError, match="world.cpu_affinity has no effect here: Ray or SLURM places the processes"):
        compose(["world=ray", "world.cpu_affinity=none"])
