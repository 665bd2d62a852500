"""The actor's tokenizer (rlrun/actor/tokenizer.py): tokenizer.json through `tokenizers` gives
exactly transformers' AutoTokenizer ids and texts for the actor's two calls, and the actor's
process does not import transformers."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rlrun.actor.tokenizer import JsonTokenizer, load_tokenizer, plain_pipeline
from rlrun.task.arithmetic import arithmetic_problems
from rlrun.models import tiny


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """The tiny model's tokenizer files, saved exactly as its build saves them (no weights)."""
    folder = tmp_path_factory.mktemp("tok")
    tiny.build_tokenizer(64).save_pretrained(folder)
    tiny._portable_tokenizer_config(folder / "tokenizer_config.json")
    return folder


def test_json_tokenizer_matches_transformers(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    fast, reference = load_tokenizer(tiny_tokenizer_dir), AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    assert isinstance(fast, JsonTokenizer)
    texts = [p.prompt for p in arithmetic_problems(20, 200, seed=3)]
    texts += ["  two  spaces ", "Ünïcode ~ <eos> and {braces}", "", "3 + 4 = 7.\n"]
    for text in texts:
        assert fast.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False), text
    rng = random.Random(0)
    for _ in range(300):  # completions as sampled: any ids, special tokens included
        ids = [rng.randrange(tiny.VOCAB_SIZE) for _ in range(rng.randrange(0, 12))]
        assert fast.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True), ids


@pytest.mark.parametrize(
    "change",
    [
        lambda folder: (folder / "tokenizer.json").unlink(),
        lambda folder: _edit_config(folder, clean_up_tokenization_spaces=True),
        lambda folder: _edit_config(folder, tokenizer_class="LlamaTokenizerFast"),
        lambda folder: (folder / "tokenizer_config.json").write_text("not json"),
    ],
    ids=["no tokenizer.json", "clean-up of spaces", "other class", "unreadable config"],
)
def test_fast_path_only_where_it_matches(tiny_tokenizer_dir, tmp_path, change):
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_tokenizer_dir / name).read_bytes())
    assert plain_pipeline(folder)
    change(folder)
    assert not plain_pipeline(folder)


def test_fallback_is_transformers(tiny_tokenizer_dir, tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_tokenizer_dir / name).read_bytes())
    _edit_config(folder, clean_up_tokenization_spaces=True)
    loaded = load_tokenizer(folder)
    assert not isinstance(loaded, JsonTokenizer)
    assert type(loaded).__module__.startswith("transformers")


def test_actor_process_does_not_import_transformers():
    """The restarted actor's start-up: transformers (seconds of imports) stays out of it."""
    code = "import sys, rlrun.entrypoints.actor, rlrun.actor.tokenizer; print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
