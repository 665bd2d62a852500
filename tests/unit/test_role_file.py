"""Role files: what a child needs to start, in one file, secrets excluded; unusable files are
ConfigErrors that name the file (the child exits 2, which is never retried)."""

from __future__ import annotations


import pytest
import yaml

from rlrun.config import compose
from rlrun.run.built import build
from rlrun.errors import ConfigError
from rlrun.parts.role_file import Role, read_role_file, role_from_argv, write_role_file
from rlrun.parts.role_parts import Endpoints
from rlrun.run.roles import build_specs
from rlrun.rundir import RunDir
from rlrun.supervisor import EventLog


@pytest.fixture
def run(tmp_path):
    cfg, resolved = compose(["trainer.max_train_steps=3"])
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"kind": "rlrun-run"})
    run_dir.config.write_text(resolved)
    run_dir.write_secret(run_dir.redis_password, "s3cret-password")
    return cfg, run_dir


def test_a_role_file_round_trips_and_gives_the_run_config(run):
    cfg, run_dir = run
    role = Role("actor", run_dir.root, "redis://127.0.0.1:7000/0", "/models/tiny", ["http://127.0.0.1:8000", "http://127.0.0.1:8001"],
                config=yaml.safe_load(run_dir.config.read_text()))  # fmt: skip
    path = write_role_file(run_dir, role)
    assert path == run_dir.root / "roles" / "actor.yaml"
    again = read_role_file(path)
    assert again == role
    assert again.load_config() == cfg
    assert again.run.root == run_dir.root


def test_the_specs_start_each_rlrun_child_with_its_role_file_and_no_secret_in_it(run):
    cfg, run_dir = run
    endpoints = Endpoints("redis://127.0.0.1:7000/0", 7000, ["http://127.0.0.1:8000"])
    specs = {s.name: s for s in build_specs(build(cfg), run_dir, endpoints, "/models/tiny", EventLog(None))}
    for name in ("trainer", "actor"):
        spec = specs[name]
        assert spec.argv[-1] == str(run_dir.role_file(name)) and "--redis-url" not in spec.argv
        spec.before_start()  # what the supervisor runs before every (re)start
        text = run_dir.role_file(name).read_text()
        assert "s3cret-password" not in text and run_dir.vllm_api_key.name not in text
        role = read_role_file(run_dir.role_file(name))
        assert (role.name, role.redis_url, role.vllm_urls, role.model_path) == (name, endpoints.redis_url, endpoints.vllm_urls, "/models/tiny")
    assert "redis" not in {p.stem for p in run_dir.roles.iterdir()}  # only rlrun's own children have one


def test_fast_llm_weight_follower_gets_its_broadcast_endpoint(tmp_path):
    cfg, resolved = compose(["trainer=fast_llm", "trainer.device=cpu"])
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"kind": "rlrun-run"})
    run_dir.config.write_text(resolved)
    endpoints = Endpoints("redis://127.0.0.1:7000/0", 7000, ["http://127.0.0.1:8000"], broadcast_port=29500)
    (weights,) = [s for s in build_specs(build(cfg), run_dir, endpoints, "/models/tiny", EventLog(None)) if s.name == "weights"]
    weights.before_start()
    role = read_role_file(run_dir.role_file("weights"))
    assert (role.broadcast_host, role.broadcast_port) == (cfg.inference.host, 29500)


@pytest.mark.parametrize("content, fragment", [
    (None, "cannot read the role file"),
    ("just text", "not an rlrun role file"),
    ("format: 1\nname: actor\n", "incomplete"),
])  # fmt: skip
def test_an_unusable_role_file_is_a_config_error_naming_it(tmp_path, content, fragment):
    path = tmp_path / "actor.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=fragment) as failed:
        read_role_file(path)
    assert str(path) in str(failed.value)


def test_a_role_file_with_a_broken_config_fails_at_load_config(run):
    _, run_dir = run
    broken = yaml.safe_load(run_dir.config.read_text())
    broken["trainer"]["lr"] = -1.0
    path = write_role_file(run_dir, Role("trainer", run_dir.root, "redis://127.0.0.1:1/0", "/m", config=broken))
    role = role_from_argv("rlrun::trainer", [str(path)])
    with pytest.raises(ConfigError, match="trainer.lr must be greater than 0"):
        role.load_config()


def test_an_actors_index_round_trips_and_a_file_without_one_is_actor_0(run):
    _cfg, run_dir = run
    role = Role("actor-1", run_dir.root, "redis://127.0.0.1:7000/0", "/models/tiny", ["http://127.0.0.1:8001"], actor_index=1)
    path = write_role_file(run_dir, role)
    assert read_role_file(path).actor_index == 1
    data = yaml.safe_load(path.read_text())
    del data["actor_index"]  # written before actor.num_actors existed
    path.write_text(yaml.safe_dump(data))
    assert read_role_file(path).actor_index == 0


def test_an_actor_index_outside_num_actors_exits_2_before_touching_redis(run, caplog):
    from rlrun.entrypoints.actor import main as actor_main
    from rlrun.errors import ExitCode

    _cfg, run_dir = run  # actor.num_actors=1
    role = Role("actor-3", run_dir.root, "redis://127.0.0.1:1/0", "/models/tiny", [], actor_index=3,
                config=yaml.safe_load(run_dir.config.read_text()))  # fmt: skip
    assert actor_main([str(write_role_file(run_dir, role))]) == int(ExitCode.USAGE)
    assert "actor_index 3 is not an actor of this run (actor.num_actors=1)" in caplog.text
