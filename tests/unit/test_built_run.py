"""The run is built once (rlrun/run/built.py): the trainer backend is looked up and bound to the
config in one place, and every command hands that one backend to whatever asks it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlrun.backends.fast_llm.backend import FastLlmBackend
from rlrun.backends.hf import HfBackend
from rlrun.cli.app import app
from rlrun.config import compose
from rlrun.run.built import build

REPO = Path(__file__).resolve().parents[2]


def test_only_the_builder_looks_a_backend_up():
    """`backend_for` is called by `build` and nowhere else in the package (its definition aside)."""
    callers = []
    for path in sorted((REPO / "rlrun").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if called == "backend_for":
                    callers.append(f"{path.relative_to(REPO).as_posix()}:{node.lineno}")
    assert [caller.split(":")[0] for caller in callers] == ["rlrun/run/built.py"], callers


def constructions(monkeypatch, cls: type) -> list:
    """Every instance of backend class `cls` made from now on (the test's own monkeypatch undoes it)."""
    made: list = []
    original = cls.__init__

    def counted(self, *args, **kwargs) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counted)
    return made


@pytest.mark.parametrize(
    "overrides, cls",
    [
        ([], HfBackend),
        (["world=slurm"], HfBackend),  # the SLURM plan and each srun step
        (["trainer=fast_llm", "trainer.device=cpu", "world=ray", "world.address=auto"], FastLlmBackend),  # Ray's placement rows
    ],
    ids=["local-hf", "slurm-hf", "ray-fast_llm"],
)
def test_a_dry_run_binds_its_backend_once_for_preflight_specs_sockets_and_placement(overrides, cls, monkeypatch, tmp_path):
    made = constructions(monkeypatch, cls)
    result = CliRunner().invoke(app, ["train", "--dry-run", f"run.dir={tmp_path / 'run'}", *overrides])
    assert result.exit_code == 0, result.stderr + result.stdout
    assert "processes rlrun would start" in result.stdout and "trainer" in result.stdout
    assert len(made) == 1  # the preflight, the specs, the sockets and the placement all asked this one


def test_a_resume_plan_carries_the_one_backend_it_checked_with(monkeypatch, tmp_path):
    from rlrun.run.launch import create_run
    from rlrun.run.resume import plan_resume

    cfg, resolved = compose([])
    run_dir = create_run(build(cfg), resolved, [], root=tmp_path / "run")
    (run_dir.redis_dir / "appendonly.aof").parent.mkdir(parents=True, exist_ok=True)
    (run_dir.redis_dir / "appendonly.aof").write_text("")  # Redis data to resume from
    made = constructions(monkeypatch, HfBackend)
    plan = plan_resume(run_dir.root, ["trainer.max_train_steps=9"])
    assert made == [plan.built.backend]  # preflight's checks asked the backend the run then starts with
    assert plan.built.backend.cfg is plan.built.cfg and plan.built.cfg.trainer.max_train_steps == 9


@pytest.mark.parametrize(
    "overrides, roles, ranks, spread",
    [([], ("trainer",), 1, True), (["trainer=fast_llm", "trainer.device=cpu", "trainer.fast_llm.nproc_per_node=2"], ("weights", "trainer"), 2, False)],
)
def test_the_world_is_built_from_what_the_bound_backend_says(overrides, roles, ranks, spread):
    cfg, _ = compose(overrides)
    built = build(cfg)
    assert built.backend.cfg is cfg and built.world.cfg is cfg
    assert (built.world.trainer_roles, built.world.trainer_ranks, built.world.ranks_span_nodes) == (roles, ranks, spread)
    assert built.world.process_names() == ["redis", "vllm-0", *roles, "actor"]
