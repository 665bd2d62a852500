"""Composition of every shipped recipe, and the errors a user gets for bad overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rlrun.config import compose, load_resolved
from rlrun.run.built import build
from rlrun.config.compose import group_options
from rlrun.errors import ConfigError
from tests.refusals import refusal

GOLDEN = Path(__file__).parent.parent / "golden"


@pytest.mark.parametrize("recipe", ["math_gspo", "math_grpo", "smollm2_grpo", "smollm2_guess"])
def test_recipes_compose_to_their_golden_files(recipe):
    cfg, resolved = compose([f"recipe={recipe}"])
    golden = GOLDEN / f"{recipe}.yaml"
    if os.environ.get("RLRUN_UPDATE_GOLDEN"):
        golden.write_text(resolved)
    assert yaml.safe_load(resolved) == yaml.safe_load(golden.read_text())
    assert cfg.recipe == recipe


def test_gspo_and_grpo_differ_where_they_should():
    gspo, _ = compose(["recipe=math_gspo"])
    grpo, _ = compose(["recipe=math_grpo"])
    assert (gspo.algo.name, grpo.algo.name) == ("gspo", "grpo")
    # GSPO keeps a narrower trust region than GRPO's token-level range (tuned for the embedded
    # task's 1-3 token answers: see conf/recipe/math_gspo.yaml)
    assert gspo.algo.clip_eps_high < grpo.algo.clip_eps_high
    assert gspo.algo.clip_eps_low < grpo.algo.clip_eps_low
    assert gspo.algo.group_size != grpo.algo.group_size
    # both keep whole groups in every optimizer step
    for cfg in (gspo, grpo):
        assert cfg.trainer.samples_per_step % cfg.algo.group_size == 0


def test_default_recipe_is_math_gspo_and_overrides_apply():
    cfg, _ = compose(["trainer.max_train_steps=7", "actor.temperature=0.5"])
    assert cfg.recipe == "math_gspo"
    assert cfg.trainer.max_train_steps == 7 and cfg.actor.temperature == 0.5


def test_every_shipped_group_option_composes():
    for group in ("trainer", "inference", "streams", "dataset", "world"):
        for option in group_options(group):
            overrides = [f"{group}={option}"]
            if group == "dataset" and option != "arithmetic":
                overrides += ["model=qwen2_5_math_1_5b"]
            if option == "reasoning_gym":
                overrides += ["dataset.task=chain_sum"]
            compose(overrides)
    compose(["model=qwen2_5_math_1_5b", "dataset=gsm8k"])
    compose(["model=smollm2_135m", "dataset=reasoning_gym", "dataset.task=leg_counting"])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["recipe=math_ppo"], ["unknown recipe 'math_ppo'", "math_grpo, math_gspo"]),
        (["model=llama"], ["unknown model 'llama'", "tiny"]),
        (["trainer.learning_rate=1e-3"], ["unknown config key 'trainer.learning_rate'", "lr"]),
        (["+colour=blue"], ["unknown config key 'colour'", "trainer"]),
        (["trainer.lr=fast"], ["trainer.lr must be a number", "'fast'"]),
        (["trainer.max_train_steps=-3"], ["trainer.max_train_steps must be at least 1"]),
        (["algo.group_size=1"], ["algo.group_size must be at least 2"]),
        (["trainer.train_batch_size=100"], ["multiple of algo.group_size"]),
        (["model=tiny", "dataset=gsm8k"], ["model=tiny", "dataset=gsm8k"]),
        (["inference.host=0.0.0.0"], ["loopback"]),
        (["recipe"], ["invalid override"]),
    ],
)
def test_bad_input_gets_a_message_naming_the_problem(overrides, expected):
    refusal(lambda: compose(overrides), *expected)


def test_saved_resolved_config_loads_back_identically(tmp_path):
    cfg, resolved = compose(["recipe=math_grpo", "trainer.max_train_steps=11"])
    (tmp_path / "config.yaml").write_text(resolved)
    assert load_resolved(tmp_path / "config.yaml") == cfg


def test_resume_allows_only_the_allow_listed_overrides_and_reports_the_change(tmp_path):
    from rlrun.run.launch import create_run
    from rlrun.run.resume import plan_resume

    cfg, resolved = compose(["trainer.max_train_steps=5"])
    run_dir = create_run(build(cfg), resolved, [], root=tmp_path / "run")
    (run_dir.redis_dir / "appendonly.aof").write_text("")  # Redis data present
    plan = plan_resume(run_dir.root, ["trainer.max_train_steps=9", "supervisor.stop_grace_s=3"])
    assert plan.built.cfg.trainer.max_train_steps == 9 and plan.built.cfg.supervisor.stop_grace_s == 3.0
    assert plan.changes == [("trainer.max_train_steps", 5, 9), ("supervisor.stop_grace_s", 10.0, 3)]
    with pytest.raises(ConfigError, match="cannot be changed when resuming"):
        plan_resume(run_dir.root, ["model.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="must be at least 1"):
        plan_resume(run_dir.root, ["trainer.max_train_steps=0"])


def test_resume_refuses_a_run_whose_redis_data_is_gone(tmp_path):
    from rlrun.errors import RunDirError
    from rlrun.run.launch import create_run
    from rlrun.run.resume import plan_resume

    cfg, resolved = compose([])
    run_dir = create_run(build(cfg), resolved, [], root=tmp_path / "run")
    with pytest.raises(RunDirError, match="no Redis data"):
        plan_resume(run_dir.root, [])


@pytest.fixture
def resumable(tmp_path):
    from rlrun.run.launch import create_run

    cfg, resolved = compose(["trainer.max_train_steps=5"])
    run_dir = create_run(build(cfg), resolved, [], root=tmp_path / "run")
    (run_dir.redis_dir / "appendonly.aof").write_text("")  # Redis data present
    return run_dir


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("trainer.max_train_steps=many", "trainer.max_train_steps must be an integer, got 'many'"),
        ("metrics.wandb_mode=sometimes", "metrics.wandb_mode must be one of 'online', 'offline', got 'sometimes'"),
        ("supervisor.live_view=[1]", "supervisor.live_view must be true or false"),
        ("trainer.max_steps=9", "unknown config key 'trainer.max_steps'. Valid keys under 'trainer': backend,"),
        ("trainer.max_train_steps", "missing EQUAL"),
        ("trainer.max_train_steps=0", "trainer.max_train_steps must be at least 1"),
    ],
)
def test_train_and_resume_read_overrides_in_one_grammar_with_the_same_errors(resumable, override, fragment):
    from rlrun.run.resume import plan_resume

    for attempt in (lambda: compose([override]), lambda: plan_resume(resumable.root, [override])):
        refusal(attempt, fragment)


def test_resume_takes_hydra_values_and_saves_them_typed_leaving_the_rest_of_the_file_as_it_was(resumable):
    from rlrun.run.resume import apply, plan_resume

    saved = yaml.safe_load(resumable.config.read_text())
    del saved["metrics"]  # a run saved before the metrics section existed
    resumable.config.write_text(yaml.safe_dump(saved))
    plan = plan_resume(resumable.root, ["metrics.wandb_project='my project'", "supervisor.stop_grace_s=3", "metrics.wandb=true"])
    assert plan.built.cfg.metrics.wandb_project == "my project" and plan.built.cfg.metrics.wandb
    apply(plan)
    after = yaml.safe_load(resumable.config.read_text())
    assert after["metrics"] == {"wandb_project": "my project", "wandb": True}  # only what was changed
    assert after["supervisor"]["stop_grace_s"] == 3.0 and isinstance(after["supervisor"]["stop_grace_s"], float)
    assert {k: v for k, v in after.items() if k not in ("metrics", "supervisor")} == {
        k: v for k, v in saved.items() if k != "supervisor"
    }
    assert load_resolved(resumable.config) == plan.built.cfg


@pytest.mark.parametrize("override", ["+trainer.lr=1", "~trainer.lr", "trainer.max_train_steps=5,6"])
def test_resume_refuses_adding_deleting_and_sweeping(resumable, override):
    from rlrun.run.resume import plan_resume

    with pytest.raises(ConfigError, match="only key=value changes an existing key"):
        plan_resume(resumable.root, [override])


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda d: d["trainer"].update(lr="fast"), "trainer.lr must be a number, got 'fast'"),
        (lambda d: d["trainer"].update(betas=[0.9, "x"]), "trainer.betas[1] must be a number, got 'x'"),
        (lambda d: d["trainer"].update(backend="torch"), "trainer.backend must be one of 'hf', 'fast_llm', got 'torch'"),
        (lambda d: d["actor"].update(colour=1), "unknown config key 'actor.colour'. Valid keys under 'actor': temperature,"),
        (lambda d: d.pop("actor"), "config key 'actor' is required but missing"),
        (lambda d: d.update(trainer=3), "trainer must be a mapping, got 3"),
        (lambda d: d["run"].update(name="${nowhere}"), "invalid config value at 'run.name'"),
    ],
)
def test_a_saved_config_with_a_bad_key_or_type_is_refused_naming_the_key(tmp_path, edit, fragment):
    _, resolved = compose([])
    data = yaml.safe_load(resolved)
    edit(data)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    refusal(lambda: load_resolved(tmp_path / "config.yaml"), fragment)


def test_defaults_left_out_of_a_saved_config_come_from_the_schema(tmp_path):
    from rlrun.config.schema import MetricsConfig, RolePlacement

    cfg, resolved = compose(["world=ray", "world.address=auto"])
    data = yaml.safe_load(resolved)
    del data["metrics"], data["world"]["redis"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    loaded = load_resolved(tmp_path / "config.yaml")
    assert loaded.metrics == MetricsConfig() and loaded.world.redis == RolePlacement(local=True)
    assert loaded == cfg


def test_train_with_fast_llm_missing_says_so_and_creates_nothing(tmp_path):
    from typer.testing import CliRunner

    from rlrun.cli.app import app

    result = CliRunner().invoke(app, ["train", "trainer=fast_llm", f"run.dir={tmp_path / 'run'}"])
    assert result.exit_code == 3
    assert "fast-llm (not found)" in result.output and "trainer.fast_llm.command" in result.output
    assert not (tmp_path / "run").exists()
    dry = CliRunner().invoke(app, ["train", "trainer=fast_llm", "--dry-run", f"run.dir={tmp_path / 'run'}"])
    assert dry.exit_code == 0 and "fast-llm" in dry.output  # the dry run shows the command anyway


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("trainer:\n  lr: [1, 2\n", ["broken.yaml, line 3 is not valid YAML", "fix that file"]),
        (b"\xff\xfe\x00bad", ["chose is not UTF-8 text", "recipe=broken"]),
    ],
    ids=["not-yaml", "not-text"],
)
def test_a_malformed_recipe_is_a_config_error_naming_it(tmp_path, monkeypatch, text, fragments):
    """Issue 26: a recipe that is not YAML was an internal error (exit 1)."""
    import importlib
    import shutil

    module = importlib.import_module("rlrun.config.compose")
    conf = tmp_path / "conf"
    shutil.copytree(module.conf_dir(), conf)
    target = conf / "recipe" / "broken.yaml"
    target.write_bytes(text) if isinstance(text, bytes) else target.write_text(text)
    monkeypatch.setattr(module, "conf_dir", lambda: conf)
    with pytest.raises(ConfigError) as refused:
        module.compose(["recipe=broken"])
    for fragment in fragments:
        assert fragment in str(refused.value)


def test_the_progress_timeout_is_a_key_of_its_own_and_must_be_positive():
    cfg, _ = compose(["supervisor.progress_timeout_s=30"])
    assert cfg.supervisor.progress_timeout_s == 30 and compose([])[0].supervisor.progress_timeout_s == 1800
    for bad in ("0", "-5", "nan"):
        with pytest.raises(ConfigError, match="supervisor.progress_timeout_s"):
            compose([f"supervisor.progress_timeout_s={bad}"])
