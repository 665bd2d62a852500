"""The tiny model build: a real (small) build into a temporary cache, loaded back by transformers."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from rlrun.models import tiny
from rlrun.models.tiny import MARKER, ensure_tiny_model

pytestmark = pytest.mark.timeout(300)

PARAMS = dict(seed=0, warm_start_steps=5, max_operand=9, max_model_len=32)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("cache"), **PARAMS)


def test_folder_is_complete_and_marked(built: Path):
    names = {p.name for p in built.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    marker = json.loads((built / MARKER).read_text())
    assert marker["build"] == {**PARAMS, "format_version": tiny.FORMAT_VERSION}
    assert 250_000 < marker["parameters"] < 350_000
    assert 0.0 <= marker["accuracy"]["sampled_t1"] <= 1.0
    assert marker["accuracy"]["problems"] == 100
    assert marker["warm_start"]["steps"] == PARAMS["warm_start_steps"]
    assert marker["warm_start"]["last_loss"] < marker["warm_start"]["first_loss"]
    # nothing half-built is left next to it
    assert [p.name for p in built.parent.iterdir() if ".tmp-" in p.name] == []


def test_second_call_reuses_the_folder_without_rebuilding(built: Path, monkeypatch):
    before = (built / MARKER).stat().st_mtime_ns, (built / "model.safetensors").stat().st_mtime_ns

    def no_build(*_args, **_kwargs):
        raise AssertionError("rebuilt a model that was already in the cache")

    monkeypatch.setattr(tiny, "_build", no_build)
    again = ensure_tiny_model(built.parent, **PARAMS)
    assert again == built
    assert ((built / MARKER).stat().st_mtime_ns, (built / "model.safetensors").stat().st_mtime_ns) == before


def test_transformers_loads_model_and_tokenizer(built: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = AutoTokenizer.from_pretrained(built)
    config = model.config
    assert config.model_type == "qwen2"
    assert config.hidden_size // config.num_attention_heads == 64  # what vLLM derives: head_dim is absent
    # Fast-LLM's Qwen2 importer refuses a config.json with a `head_dim` key it does not expect.
    assert "head_dim" not in json.loads((built / "config.json").read_text())
    assert (config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers) == (2, 1, 2)
    assert config.vocab_size == len(tokenizer) == 64
    assert not config.tie_word_embeddings  # the cached build (tied models: test_vllm_weight_updates.py)
    assert config.max_position_embeddings == PARAMS["max_model_len"]
    assert model.dtype == torch.float32
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert eos is not None and pad is not None and eos != pad
    assert (config.eos_token_id, config.pad_token_id) == (eos, pad)
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (eos, pad)
    assert config.bos_token_id == model.generation_config.bos_token_id == tokenizer.bos_token_id
    logits = model(input_ids=torch.tensor([tokenizer.encode("3+4=")])).logits
    assert logits.shape == (1, 4, 64)


def test_tokenizer_is_one_id_per_character_and_round_trips(built: Path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built)
    raw = Tokenizer.from_file(str(built / "tokenizer.json"))  # what a non-transformers reader sees
    for text in ["12+7=19", "3+4=", "99+99=198", " a b  ,c ", "x*y-z=0"]:
        ids = tokenizer.encode(text)
        assert len(ids) == len(text)  # one id per character, nothing added
        assert tokenizer.decode(ids) == text
        assert raw.encode(text).ids == ids
    ids = tokenizer.encode("12+7=19")
    assert len(set(ids)) == 6 and ids[0] == ids[5]  # both "1"s share an id, the other characters differ
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == "12+7=19"
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<eos>"


def test_warm_start_trains_the_answer():
    import torch

    from rlrun.task.arithmetic import arithmetic_problems

    tokenizer = tiny.build_tokenizer(32)
    cache = {}
    for steps in (0, 30):
        build = tiny.TinyBuild(seed=1, warm_start_steps=steps, max_operand=9, max_model_len=32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            model = tiny._new_model(build, tokenizer)
            problems = arithmetic_problems(9, 100, 1)
            losses = tiny._warm_start(model, tokenizer, problems, build)
            cache[steps] = (losses, tiny._accuracy(model, tokenizer, problems, 9))
    assert cache[0][0] == []
    losses, accuracy = cache[30]
    assert losses[-1] < losses[0] / 2
    assert accuracy["sampled_t1"] > cache[0][1]["sampled_t1"] + 0.05


def test_different_parameters_give_different_folders(built: Path):
    other = ensure_tiny_model(built.parent, **{**PARAMS, "warm_start_steps": 0})
    assert other != built and other.parent == built.parent
    assert json.loads((other / MARKER).read_text())["build"]["warm_start_steps"] == 0
    changes = [("seed", 1), ("warm_start_steps", 6), ("max_operand", 8), ("max_model_len", 33)]
    names = {tiny.TinyBuild(**{**PARAMS, key: value}).folder_name() for key, value in changes}
    assert len(names | {built.name}) == 5


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    calls = []
    real_build = tiny._build

    def counting_build(build, folder):
        calls.append(folder)
        real_build(build, folder)

    monkeypatch.setattr(tiny, "_build", counting_build)
    params = {**PARAMS, "warm_start_steps": 0}
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_tiny_model(tmp_path, **params))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and len(results) == 3


def test_a_crashed_build_leaves_no_finished_looking_folder(tmp_path, monkeypatch):
    def crashing_build(build, folder):
        (folder / "config.json").write_text("{}")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(tiny, "_build", crashing_build)
    with pytest.raises(RuntimeError):
        ensure_tiny_model(tmp_path, **PARAMS)
    assert [p for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_folder_without_marker_is_rebuilt(tmp_path):
    name = tiny.TinyBuild(**{**PARAMS, "warm_start_steps": 0}).folder_name()
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps({"junk": True}))
    folder = ensure_tiny_model(tmp_path, **{**PARAMS, "warm_start_steps": 0})
    assert (folder / MARKER).is_file()
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
