"""`rlrun inspect-checkpoint`: hf and Fast-LLM checkpoints, half-written ones, run directories and
paths that are not checkpoints, in the library report and through the CLI (table and --json)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file
from typer.testing import CliRunner

from rlrun.cli import inspection as ci
from rlrun.cli.app import app
from rlrun.config.compose import compose
from rlrun.errors import ExitCode, RunDirError
from rlrun.rundir import RunDir
from rlrun.trainer import checkpoint as hf_checkpoint

WRITTEN_AT = 1_700_000_000.0


@pytest.fixture(scope="module")
def resolved_yaml() -> str:
    _, text = compose(["recipe=math_gspo", "trainer.max_train_steps=7"])
    return text


def make_run(root: Path, resolved_yaml: str) -> RunDir:
    run = RunDir(root)
    run.create({"name": root.name})
    run.config.write_text(resolved_yaml)
    return run


def write_hf(folder: Path, step: int, *, samples: int, version: int, ok: bool = True, config_hash: str = "") -> Path:
    """The files `rlrun.trainer.checkpoint.save` writes, without building a model."""
    folder.mkdir(parents=True)
    save_file({"lm_head.weight": torch.zeros(4, 8)}, folder / "model.safetensors")
    (folder / "config.json").write_text('{"model_type": "qwen2"}\n')
    torch.save({"state": {}, "param_groups": [{"lr": 1e-3, "params": [0]}]}, folder / "optimizer.pt")
    state = hf_checkpoint.TrainerState(step, samples, version, WRITTEN_AT + step, config_hash)
    (folder / hf_checkpoint.STATE_FILE).write_text(json.dumps(asdict(state)) + "\n")
    if ok:
        (folder / hf_checkpoint.OK_MARKER).write_text("ok\n")
    return folder


def write_fast_llm(folder: Path, step: int, *, documents: int, ok: bool = True) -> Path:
    folder.mkdir(parents=True)
    # As Fast-LLM writes it: the trainer's counts nested under `metadata:`.
    meta = {"fast_llm_version": "0.3.0", "metadata": {"completed_steps": step, "documents_seen": documents}}
    (folder / "metadata.yaml").write_text(yaml.safe_dump(meta))
    (folder / "rank_0.safetensors").write_bytes(b"\0" * 100)
    if ok:
        (folder / "ok").write_text("")
    return folder


def sha12(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def plain(text: str) -> str:
    """Rich output without table borders, whitespace collapsed (long cells may fold)."""
    return " ".join("".join(" " if "\u2500" <= c <= "\u257f" else c for c in text).split())


def invoke(*args: str):
    return CliRunner().invoke(app, ["inspect-checkpoint", *args])


# --- hf ----------------------------------------------------------------------------------------


def test_hf_checkpoint_in_a_run(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    folder = write_hf(run.checkpoint(50), 50, samples=1600, version=51, config_hash=sha12(run.config))

    report = ci.inspect_path(folder)

    assert (report.layout, report.step, report.samples_processed, report.policy_version) == ("hf", 50, 1600, 51)
    assert report.documents_seen is None
    assert report.complete and report.warnings == []
    assert (report.written_at, report.written_at_source) == (WRITTEN_AT + 50, "trainer_state.json")
    assert report.run_dir == str(run.root.absolute()) and not report.selected_from_run
    assert report.config_hash == sha12(run.config) == report.checkpoint_config_hash
    assert report.config == ci.ConfigSummary(
        recipe="math_gspo", algo="gspo", model=report.config.model, trainer_backend="hf",
        max_train_steps=7, samples_per_step=report.config.samples_per_step,
    )
    cfg = yaml.safe_load(resolved_yaml)
    assert report.config.model == cfg["model"]["name"]
    assert report.config.samples_per_step == cfg["trainer"]["train_batch_size"] * cfg["trainer"]["gradient_accumulation_passes"]
    sizes = {f.name: f.size for f in report.files}
    assert set(sizes) == {"model.safetensors", "config.json", "optimizer.pt", "trainer_state.json", "ok"}
    assert sizes["model.safetensors"] == (folder / "model.safetensors").stat().st_size > 4 * 8 * 4
    assert report.total_bytes == sum(sizes.values())


def test_a_config_edited_after_the_checkpoint_is_flagged(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    folder = write_hf(run.checkpoint(5), 5, samples=10, version=6, config_hash="000000000000")
    report = ci.inspect_path(folder)
    assert report.complete
    assert any("config.yaml changed" in w and "000000000000" in w for w in report.warnings)


def test_hf_checkpoint_outside_a_run_has_no_config(tmp_path):
    folder = write_hf(tmp_path / "step_000003", 3, samples=30, version=4)
    report = ci.inspect_path(folder)
    assert (report.step, report.run_dir, report.config, report.config_hash) == (3, None, None, None)
    journal, note = ci.read_journal(report)
    assert journal is None and note == ci.NO_RUN_FOR_JOURNAL


def test_half_written_hf_checkpoint_is_reported_incomplete(tmp_path):
    folder = write_hf(tmp_path / "checkpoints" / "step_000020", 20, samples=200, version=21, ok=False)
    report = ci.inspect_path(folder)
    assert not report.complete
    assert ci.HALF_WRITTEN in report.warnings
    assert (report.step, report.samples_processed) == (20, 200)
    assert "ok" not in {f.name for f in report.files}


def test_temporary_hf_folder_without_state_is_half_written_with_step_from_its_name(tmp_path):
    folder = tmp_path / ".tmp-step_000030"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, folder / "model.safetensors")
    os.utime(folder / "model.safetensors", (WRITTEN_AT, WRITTEN_AT))
    report = ci.inspect_path(folder)
    assert (report.layout, report.step, report.complete, report.samples_processed) == ("hf", 30, False, None)
    assert (report.written_at, report.written_at_source) == (WRITTEN_AT, "mtime of model.safetensors")


# --- Fast-LLM ----------------------------------------------------------------------------------


def test_fast_llm_checkpoint(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    folder = write_fast_llm(run.root / "fast_llm" / "checkpoint" / "12", 12, documents=12_500)
    os.utime(folder / "ok", (WRITTEN_AT, WRITTEN_AT))

    report = ci.inspect_path(folder)

    assert (report.layout, report.step, report.documents_seen) == ("fast_llm", 12, 12_500)
    assert (report.samples_processed, report.policy_version) == (None, None)
    assert report.complete and report.warnings == []
    assert (report.written_at, report.written_at_source) == (WRITTEN_AT, "mtime of ok")
    assert report.run_dir == str(run.root.absolute())
    assert report.config_hash == sha12(run.config) and report.config.recipe == "math_gspo"
    assert {f.name: f.size for f in report.files}["rank_0.safetensors"] == 100


def test_half_written_fast_llm_checkpoint(tmp_path):
    folder = write_fast_llm(tmp_path / "exp" / "checkpoint" / "8", 8, documents=900, ok=False)
    report = ci.inspect_path(folder)
    assert (report.layout, report.step, report.complete) == ("fast_llm", 8, False)
    assert report.warnings == [ci.HALF_WRITTEN]


def test_fast_llm_folder_name_disagreeing_with_metadata_is_flagged(tmp_path):
    folder = write_fast_llm(tmp_path / "checkpoint" / "9", 10, documents=1)
    report = ci.inspect_path(folder)
    assert report.step == 10
    assert any("folder name says step 9" in w for w in report.warnings)


# --- run directories ---------------------------------------------------------------------------


def test_run_directory_picks_the_latest_complete_checkpoint_and_skips_newer_half_written(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    write_hf(run.checkpoint(10), 10, samples=100, version=11)
    write_hf(run.checkpoint(20), 20, samples=200, version=21)
    write_hf(run.checkpoint(30), 30, samples=300, version=31, ok=False)

    report = ci.inspect_path(run.root)

    assert report.selected_from_run and report.complete
    assert (report.step, report.samples_processed, report.policy_version) == (20, 200, 21)
    assert report.path == str(run.checkpoint(20).absolute())
    assert report.skipped_half_written == ["checkpoints/step_000030"]
    assert Path(report.path) == hf_checkpoint.latest_complete(run.checkpoints).absolute()  # what resume loads


def test_run_directory_skips_a_damaged_checkpoint_as_resume_does(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    write_hf(run.checkpoint(10), 10, samples=100, version=11)
    damaged = write_hf(run.checkpoint(20), 20, samples=200, version=21)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])  # truncated after the `ok` marker was written

    report = ci.inspect_path(run.root)

    assert report.step == 10 and Path(report.path) == hf_checkpoint.resume_point(run.checkpoints).absolute()
    (skipped,) = report.skipped_damaged
    assert skipped.startswith("checkpoints/step_000020: model.safetensors is truncated") and report.skipped_half_written == []
    weights.unlink()
    (run.checkpoint(10) / "config.json").write_text("[]")
    with pytest.raises(RunDirError, match="every complete one is damaged"):
        ci.inspect_path(run.root)


def test_run_directory_with_fast_llm_checkpoints(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    write_fast_llm(run.root / "fast_llm" / "checkpoint" / "4", 4, documents=400)
    write_fast_llm(run.root / "fast_llm" / "checkpoint" / "16", 16, documents=1700)  # 16 > 4 numerically
    write_fast_llm(run.root / "fast_llm" / "checkpoint" / "20", 20, documents=2100, ok=False)
    report = ci.inspect_path(run.root)
    assert (report.layout, report.step, report.documents_seen) == ("fast_llm", 16, 1700)
    assert report.skipped_half_written == ["fast_llm/checkpoint/20"]


def test_run_directory_without_a_complete_checkpoint_is_an_error(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    write_hf(run.checkpoint(5), 5, samples=5, version=6, ok=False)
    with pytest.raises(RunDirError, match="no complete checkpoint.*step_000005"):
        ci.inspect_path(run.root)


# --- not a checkpoint --------------------------------------------------------------------------


def test_paths_that_are_not_checkpoints(tmp_path, resolved_yaml):
    with pytest.raises(RunDirError, match="does not exist: expected an hf checkpoint"):
        ci.inspect_path(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        ci.inspect_path(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="is not a checkpoint: expected .*metadata.yaml.*rlrun-run.json"):
        ci.inspect_path(tmp_path / "empty")
    run = make_run(tmp_path / "run", resolved_yaml)
    write_hf(run.checkpoint(1), 1, samples=1, version=2)
    with pytest.raises(RunDirError, match="holds checkpoints: give one of them, e.g. .*step_000001") as err:
        ci.inspect_path(run.checkpoints)
    assert err.value.exit_code == ExitCode.RUN_DIR


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_table_for_a_run_directory(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    write_hf(run.checkpoint(10), 10, samples=100, version=11)
    write_hf(run.checkpoint(20), 20, samples=200, version=21, ok=False)
    result = invoke(str(run.root))
    assert result.exit_code == 0, result.output
    out = plain(result.stdout)
    assert "latest complete checkpoint is" in out and "step_000010" in out
    assert "skipped half-written checkpoint checkpoints/step_000020" in out
    for expected in ("layout hf", "samples processed 100", "policy version 11", "complete yes (ok marker, nothing damaged)",
                     "recipe math_gspo", "max train steps 7", "model.safetensors", "optimizer.pt",
                     f"config hash {sha12(run.config)}", f"journal: {ci.REDIS_NOT_RUNNING}"):
        assert expected in out, expected
    assert result.stderr == ""


def test_cli_json_for_an_hf_checkpoint(tmp_path, resolved_yaml):
    run = make_run(tmp_path / "run", resolved_yaml)
    folder = write_hf(run.checkpoint(10), 10, samples=100, version=11)
    result = invoke(str(folder), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # exactly one JSON document, nothing else on stdout
    assert (data["layout"], data["step"], data["samples_processed"], data["policy_version"]) == ("hf", 10, 100, 11)
    assert data["complete"] is True
    assert data["written_at_iso"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(WRITTEN_AT + 10))
    assert data["config"]["recipe"] == "math_gspo" and data["config_hash"] == sha12(run.config)
    assert {f["name"] for f in data["files"]} >= {"model.safetensors", "optimizer.pt", "ok"}
    assert data["journal"] is None and data["journal_note"] == ci.REDIS_NOT_RUNNING


def test_cli_fast_llm_checkpoint_table_and_json(tmp_path):
    folder = write_fast_llm(tmp_path / "exp" / "checkpoint" / "3", 3, documents=330)
    table = invoke(str(folder))
    assert table.exit_code == 0, table.output
    out = plain(table.stdout)
    assert "layout fast_llm" in out and "documents seen 330" in out and "rank_0.safetensors" in out
    data = json.loads(invoke(str(folder), "--json").stdout)
    assert (data["layout"], data["step"], data["documents_seen"]) == ("fast_llm", 3, 330)


def _sealed(folder: Path) -> Path:
    """The `ok` marker as `checkpoint.save` writes it: every file's size."""
    sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.name != "ok"}
    (folder / "ok").write_text(json.dumps({"files": sizes}))
    return folder


def _garbage_state(folder: Path) -> None:
    (folder / hf_checkpoint.STATE_FILE).write_text("{garbage")
    _sealed(folder)  # sizes as written: only reading it tells


CHECKPOINT_DAMAGE = [
    ("weights-truncated", lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:60]), "model.safetensors holds 60 bytes"),
    ("state-garbage", _garbage_state, "trainer_state.json is unreadable"),
    ("optimizer-missing", lambda f: (f / "optimizer.pt").unlink(), "optimizer.pt is missing"),
]


@pytest.mark.parametrize("name, damage, why", CHECKPOINT_DAMAGE, ids=[c[0] for c in CHECKPOINT_DAMAGE])
def test_a_damaged_checkpoint_given_itself_is_judged_as_through_its_run(tmp_path, resolved_yaml, name, damage, why):
    """Issue 26: the folder itself was called complete ("yes") while the run directory's view, the
    trainer's rule, skipped it as damaged; both now say damaged, and the CLI exits 4."""
    run = make_run(tmp_path / "run", resolved_yaml)
    write_hf(run.checkpoint(10), 10, samples=100, version=11)
    folder = _sealed(write_hf(run.checkpoint(20), 20, samples=200, version=21))
    damage(folder)
    through_run = ci.inspect_path(run.root)
    assert through_run.path == str(run.checkpoint(10)) and why in through_run.skipped_damaged[0]
    itself = ci.inspect_path(folder)
    assert not itself.complete and why in itself.damaged and ci.damaged_warning(itself.damaged) in itself.warnings
    table = invoke(str(folder))
    assert table.exit_code == 4 and "NO: damaged" in plain(table.stdout) and why in plain(table.stderr)
    data = json.loads(invoke(str(folder), "--json").stdout)
    assert data["complete"] is False and why in data["damaged"]


def test_cli_half_written_checkpoint_is_shown_then_exits_4(tmp_path):
    folder = write_hf(tmp_path / "step_000007", 7, samples=70, version=8, ok=False)
    table = invoke(str(folder))
    assert table.exit_code == ExitCode.RUN_DIR == 4
    assert "NO: half-written" in table.stdout and "samples processed" in table.stdout
    assert ci.HALF_WRITTEN in plain(table.stderr)

    result = invoke(str(folder), "--json")
    assert result.exit_code == 4
    data = json.loads(result.stdout)
    assert data["complete"] is False and data["step"] == 7 and ci.HALF_WRITTEN in data["warnings"]
    assert ci.HALF_WRITTEN in plain(result.stderr)


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_not_a_checkpoint_is_an_error_with_nothing_on_stdout(tmp_path, as_json):
    (tmp_path / "nothing").mkdir()
    result = invoke(str(tmp_path / "nothing"), *(["--json"] if as_json else []))
    assert result.exit_code == 4
    assert result.stdout == ""
    assert "is not a checkpoint: expected an hf checkpoint" in plain(result.stderr)


def test_cli_unreachable_redis_url_is_an_environment_error(tmp_path):
    folder = write_hf(tmp_path / "step_000001", 1, samples=1, version=2)
    result = invoke(str(folder), "--json", "--redis-url", "redis://127.0.0.1:1/0")
    assert result.exit_code == ExitCode.ENVIRONMENT
    assert result.stdout == "" and "cannot read the token journal" in plain(result.stderr)
