"""A checkpoint is a whole Hugging Face folder (the run's tokenizer and chat template included) that
transformers loads alone, and `rlrun export` copies one out as a clean folder, refusing what it
cannot copy whole and leaving the run directory as it was."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rlrun.cli.app import app
from rlrun.config.compose import compose
from rlrun.models import tiny
from rlrun.rundir import RunDir
from rlrun.trainer import checkpoint
from rlrun.trainer.checkpoint import TrainerState
from rlrun.trainer.parallel import Parallel, Ranks

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
TEXT = "12+34=46"
MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """The tiny model's folder as its build writes it (without the warm start), with a chat template."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = tiny.build_tokenizer(32)
    tiny._new_model(tiny.TinyBuild(seed=0, warm_start_steps=0, max_operand=9, max_model_len=32), tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tiny._portable_tokenizer_config(folder / "tokenizer_config.json")
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


def trained_run(root: Path, model_folder: Path, steps: int = 2, tokenizer: bool = True) -> RunDir:
    """A run whose trainer took `steps` steps from `model_folder`, a checkpoint after each, as the
    hf trainer writes them."""
    from transformers import AutoModelForCausalLM

    run = RunDir(root)
    run.create({"name": root.name})
    run.config.write_text(compose(["model.source=path", f"model.path={model_folder}"])[1])
    model = AutoModelForCausalLM.from_pretrained(model_folder)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(1, steps + 1):
        model(torch.tensor([[5, 6, 7]])).logits.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        checkpoint.save(model, optimizer, TrainerState(step, 8 * step, step), run.checkpoint(step), keep=5,
                        parallel=Parallel(Ranks()), tokenizer_from=model_folder if tokenizer else None)  # fmt: skip
    return run


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def check_loads(folder: Path, model_folder: Path) -> None:
    """transformers loads `folder` alone: the tokenizer round-trips and agrees with the base model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, base = AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(model_folder)
    ids = tokenizer.encode(TEXT)
    assert ids == base.encode(TEXT) and len(ids) == len(TEXT)  # one id per character
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.eos_token == base.eos_token and tokenizer.pad_token_id == base.pad_token_id
    chat = tokenizer.apply_chat_template([{"role": "user", "content": TEXT}], tokenize=False, add_generation_prompt=True)
    assert chat == f"<user>{TEXT}<assistant>"
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == tiny.VOCAB_SIZE and model(torch.tensor([ids])).logits.shape == (1, len(ids), tiny.VOCAB_SIZE)


def invoke(*args: str):
    return CliRunner().invoke(app, ["export", *map(str, args)])


def test_a_checkpoint_carries_the_tokenizer_and_chat_template_and_loads_alone(tmp_path, model_folder):
    run = trained_run(tmp_path / "run", model_folder, steps=1)
    path = run.checkpoint(1)
    assert checkpoint.problem(path) is None
    listed = checkpoint.manifest(path)
    assert MODEL_FILES | {checkpoint.STATE_FILE, checkpoint.OPTIMIZER_FILE} <= set(listed)  # the `ok` manifest covers them
    assert (path / "chat_template.jinja").read_text() == TEMPLATE
    check_loads(path, model_folder)
    report = json.loads(CliRunner().invoke(app, ["inspect-checkpoint", str(path), "--json"]).output)
    assert report["complete"] is True and {"tokenizer.json", "chat_template.jinja"} <= {f["name"] for f in report["files"]}


def test_a_changed_tokenizer_file_makes_the_checkpoint_damaged(tmp_path, model_folder):
    run = trained_run(tmp_path / "run", model_folder, steps=1)
    with open(run.checkpoint(1) / "tokenizer.json", "a") as handle:
        handle.write(" ")
    assert "tokenizer.json holds" in checkpoint.problem(run.checkpoint(1))


def test_export_copies_the_newest_checkpoint_as_a_clean_hf_folder(tmp_path, model_folder):
    run = trained_run(tmp_path / "run", model_folder)
    before = files_of(run.root)
    out = tmp_path / "exported"
    result = invoke(run.root, out)
    assert result.exit_code == 0, result.output
    assert "exported step 2" in " ".join(result.output.split())
    assert {p.name for p in out.iterdir()} == MODEL_FILES  # no optimizer, trainer state or `ok`
    assert filecmp.cmp(out / "model.safetensors", run.checkpoint(2) / "model.safetensors", shallow=False)
    check_loads(out, model_folder)
    assert files_of(run.root) == before
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_export_of_a_chosen_step_and_into_an_empty_folder(tmp_path, model_folder):
    run = trained_run(tmp_path / "run", model_folder)
    out = tmp_path / "empty"
    out.mkdir()
    result = invoke(run.root, out, "--step", "1")
    assert result.exit_code == 0, result.output
    assert filecmp.cmp(out / "model.safetensors", run.checkpoint(1) / "model.safetensors", shallow=False)
    assert not filecmp.cmp(out / "model.safetensors", run.checkpoint(2) / "model.safetensors", shallow=False)


def test_export_refuses_what_it_cannot_copy_whole_with_exit_4_and_changes_nothing(tmp_path, model_folder):
    run = trained_run(tmp_path / "run", model_folder)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("keep me")
    with open(run.checkpoint(2) / "model.safetensors", "r+b") as handle:
        handle.truncate(100)
    (run.checkpoint(1) / checkpoint.OK_MARKER).rename(tmp_path / "ok-of-step-1")  # step 1: half-written now
    before = files_of(run.root)
    cases = [
        ((run.root, occupied), f"{occupied} is not empty"),
        ((run.root, tmp_path / "a", "--step", "7"), "has no checkpoint of step 7 (checkpoints: 1, 2)"),
        ((run.root, tmp_path / "b", "--step", "2"), "is damaged: model.safetensors holds 100 bytes"),
        ((run.root, tmp_path / "c", "--step", "1"), "is half-written"),
        ((run.root, tmp_path / "d"), "has no complete checkpoint to export; every complete one is damaged (step_000002: model.safetensors holds 100 bytes"),
        ((run.root, run.root / "inside"), "is inside the run directory"),
        ((tmp_path / "occupied", tmp_path / "e"), "is not an rlrun run directory"),
    ]
    for args, message in cases:
        result = invoke(*args)
        assert result.exit_code == 4, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
    assert files_of(run.root) == before
    assert [p.name for p in occupied.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["occupied", "ok-of-step-1", "run"]  # nothing else written


def test_export_skips_a_damaged_newest_checkpoint_as_resume_does_and_says_so(tmp_path, model_folder):
    run = trained_run(tmp_path / "run", model_folder)
    with open(run.checkpoint(2) / "config.json", "a") as handle:
        handle.write("\n")
    result = invoke(run.root, tmp_path / "out")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "skipped damaged checkpoint step_000002: config.json holds" in text and "exported step 1" in text
    assert filecmp.cmp(tmp_path / "out" / "model.safetensors", run.checkpoint(1) / "model.safetensors", shallow=False)


def test_a_checkpoint_written_without_a_tokenizer_is_exported_with_the_run_models(tmp_path, model_folder):
    run = trained_run(tmp_path / "run", model_folder, steps=1, tokenizer=False)
    assert not checkpoint.has_tokenizer(run.checkpoint(1))
    result = invoke(run.root, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "copied from the run's model folder" in " ".join(result.output.split())
    assert {p.name for p in (tmp_path / "out").iterdir()} == MODEL_FILES
    check_loads(tmp_path / "out", model_folder)


def test_a_run_without_checkpoints_is_refused_naming_why(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create({"name": "run"})
    result = invoke(run.root, tmp_path / "out")
    assert result.exit_code == 4 and "(none in checkpoints/ yet" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()
