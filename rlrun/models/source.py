"""Where a run's model comes from: the tiny model rlrun builds, a GGUF file rebuilt once, a local
folder, or the hub."""

from __future__ import annotations

from pathlib import Path

from rlrun.config.schema import DatasetConfig, ModelConfig
from rlrun.errors import EnvironmentProblem
from rlrun.models import tiny
from rlrun.models.gguf import built_folder, ensure_gguf_model
from rlrun.models.tiny import TinyBuild, ensure_tiny_model


def config_problems(m: ModelConfig, dataset: DatasetConfig) -> list[str]:
    """What the model the config chooses says of the config, one sentence each (asked by preflight)."""
    if m.source == "tiny":
        return tiny.config_problems(m.max_model_len, dataset.name, dataset.max_operand)
    return []


def model_path(m: ModelConfig, build: bool, *, seed: int, max_operand: int) -> str:
    """The folder (or hub id) vLLM and the trainer load. Builds the tiny or GGUF model if asked to.
    `seed` (run.seed) and `max_operand` (dataset.max_operand) make the tiny model; others ignore them."""
    if m.source == "tiny":
        args = dict(
            seed=seed,
            warm_start_steps=m.warm_start_steps,
            max_operand=max_operand,
            max_model_len=m.max_model_len,
        )
        if not build:
            return str(Path(m.cache_dir).expanduser() / TinyBuild(**args).folder_name())
        return str(ensure_tiny_model(Path(m.cache_dir), **args))
    assert m.path is not None  # the config's check: model.path is set unless model.source=tiny
    if m.source == "gguf":
        return str(ensure_gguf_model(m.cache_dir, m.path) if build else built_folder(m.cache_dir, m.path))
    if m.source == "path":  # a Hugging Face model folder (rlrun.run.preflight.check_model)
        return str(Path(m.path).expanduser().resolve())
    try:  # a hub id: fetched once into the Hugging Face cache, then served from that folder
        from huggingface_hub import snapshot_download

        return snapshot_download(m.path)
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot get the model"
        raise EnvironmentProblem(
            f"cannot fetch model {m.path!r} from the Hugging Face hub ({exc}). Download it where the hub is "
            f"reachable and use model.source=path model.path=FOLDER."
        ) from None
