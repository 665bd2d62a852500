"""actor.num_actors=K: how actors split prompts, servers and a step (pure), what each process is
told, and the configs that cannot work."""

from __future__ import annotations

import pytest

from rlrun.actor.partition import group_namespace, prompt_position, servers_of, share
from rlrun.actor.trainer_view import HfView
from rlrun.config import compose
from rlrun.errors import ConfigError
from rlrun.parts.role_file import read_role_file
from rlrun.parts.role_parts import Endpoints
from rlrun.run.built import build
from rlrun.run.roles import build_specs
from rlrun.rundir import RunDir
from rlrun.streams import names
from rlrun.streams.names import actor_name
from rlrun.supervisor import EventLog


@pytest.mark.parametrize("k_all", [1, 2, 3, 5])
def test_the_actors_prompts_are_disjoint_and_cover_the_order(k_all):
    seen = {}
    for k in range(k_all):
        for cursor in range(40):
            position = prompt_position(cursor, k, k_all)
            assert position not in seen, f"position {position} given to actors {seen[position]} and {k}"
            seen[position] = k
    assert set(seen) >= set(range(40 * k_all)) and len(seen) == 40 * k_all  # no gap


def test_each_server_belongs_to_one_actor_and_each_actor_has_one():
    assert [servers_of(k, 2, 2) for k in range(2)] == [[0], [1]]
    assert [servers_of(k, 2, 5) for k in range(2)] == [[0, 2, 4], [1, 3]]
    assert [servers_of(k, 3, 4) for k in range(3)] == [[0, 3], [1], [2]]
    assert [servers_of(k, 3, 2) for k in range(3)] == [[0], [1], [0]]  # fewer servers: shared
    with pytest.raises(ValueError, match="at least one vLLM server"):
        servers_of(0, 3, 0)
    with pytest.raises(ValueError, match="0 <= actor < num_actors"):
        servers_of(2, 2, 4)


def test_shares_of_a_step_add_up():
    for total in range(0, 13):
        for k_all in range(1, 5):
            parts = [share(total, k, k_all) for k in range(k_all)]
            assert sum(parts) == total and max(parts) - min(parts) <= 1


def test_names_ids_streams_and_state_keys_keep_a_lone_actor_as_it_was():
    assert actor_name(0, 1) == "actor" and group_namespace("run", 0, 1) == "run"
    assert names.actor_stream(0, 1) == names.GROUPS_STREAM and names.actor_state(0, 1) == names.ACTOR_STATE
    assert [actor_name(k, 2) for k in range(2)] == ["actor-0", "actor-1"]
    assert group_namespace("run", 1, 2) == "run/a1"
    streams = names.groups_streams(3)
    assert streams == ["rlrun:groups:{a0}", "rlrun:groups:{a1}", "rlrun:groups:{a2}"]
    # each actor's journal and state hash share its stream's hash tag (one Redis Cluster slot)
    assert [names.hash_tag(names.journal_prefix(s)) for s in streams] == ["a0", "a1", "a2"]
    assert [names.hash_tag(key) for key in names.actor_states(3)] == ["a0", "a1", "a2"]
    assert len({names.journal_prefix(s) for s in streams}) == 3  # a namespace each


def test_each_actor_process_gets_its_index_and_only_its_servers_in_its_role_file(tmp_path):
    cfg, resolved = compose(["actor.num_actors=2", "inference.num_servers=3"])
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"kind": "rlrun-run"})
    run_dir.config.write_text(resolved)
    servers = ["http://127.0.0.1:8000", "http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    endpoints = Endpoints("redis://127.0.0.1:7000/0", 7000, servers)
    specs = {spec.name: spec for spec in build_specs(build(cfg), run_dir, endpoints, "/models/tiny", EventLog(None))}
    assert [n for n in specs if n.startswith("actor")] == ["actor-0", "actor-1"]
    for k, owned in ((0, [0, 2]), (1, [1])):
        spec = specs[f"actor-{k}"]
        assert spec.argv[-1] == str(run_dir.role_file(f"actor-{k}"))
        spec.before_start()  # what the supervisor runs before every (re)start
        role = read_role_file(run_dir.role_file(f"actor-{k}"))
        assert (role.name, role.actor_index) == (f"actor-{k}", k)
        assert role.vllm_urls == [servers[i] for i in owned]
        assert spec.log_path.name.startswith(f"actor-{k}")


def test_each_actor_runs_ahead_by_its_share_of_a_step():
    cfg, _ = compose(["actor.num_actors=3", "inference.num_servers=3", "trainer.train_batch_size=40", "algo.group_size=8"])
    assert cfg.groups_per_step == 5
    views = [HfView(cfg.actor, cfg.groups_per_step, None, k) for k in range(3)]
    assert [v.groups_per_step for v in views] == [2, 2, 1] and [v.stream for v in views] == names.groups_streams(3)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["actor.num_actors=0"], "actor.num_actors must be at least 1"),
        (["actor.num_actors=2", "inference.num_servers=2", "actor.journal=false"], "needs actor.journal=true"),
    ],
)
def test_configs_that_cannot_work_are_refused(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compose(overrides)


def test_dry_run_shows_which_actor_owns_which_servers_and_prompts(tmp_path):
    from typer.testing import CliRunner

    from rlrun.cli.app import app

    dry = CliRunner().invoke(
        app, ["train", "--dry-run", "actor.num_actors=2", "inference.num_servers=3", f"run.dir={tmp_path / 'run'}"],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert dry.exit_code == 0, dry.output
    rows = [line for line in dry.output.splitlines() if "actor-0 " in line or "actor-1 " in line]
    assert any("vllm-0, vllm-2" in r and "0, 2, 4" in r for r in rows), dry.output[-2000:]
    assert any("vllm-1" in r and "vllm-0" not in r and "1, 3, 5" in r for r in rows), dry.output[-2000:]
    assert not (tmp_path / "run").exists()


def test_the_journal_summaries_of_several_actors_add_up():
    from rlrun.cli.inspection import combined_summary

    one = {"prompt_cursor": 3, "tokens_saved": 5, "policy_version": 4, "max_prefix_lag": 1, "max_prefix_staleness": 2, "stale_prefixes": None}
    two = {"prompt_cursor": 4, "tokens_saved": 0, "policy_version": 4, "max_prefix_lag": None, "max_prefix_staleness": 2, "stale_prefixes": None}
    assert combined_summary({"actor": one}) == one  # a lone actor: as before
    total = combined_summary({"actor-0": one, "actor-1": two})
    assert total["prompt_cursor"] == 7 and total["tokens_saved"] == 5
    assert total["policy_version"] == 4 and total["max_prefix_staleness"] == 2 and total["max_prefix_lag"] == 1
    assert total["stale_prefixes"] is None and total["actors"] == {"actor-0": one, "actor-1": two}
