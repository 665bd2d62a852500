"""`rlrun export RUN_DIR [--step N] OUT_DIR`: a run's trained model as a Hugging Face folder.

Copies the checkpoint a resume would load (or step N) without what only the trainer reads (the
optimizer, `trainer_state.json`, `ok`): the weights, config, generation config, tokenizer and chat
template, which transformers and `vllm serve` load with nothing else. It refuses (RunDirError) a
missing, half-written or damaged checkpoint and an OUT_DIR that holds anything; it writes into a
temporary sibling of OUT_DIR renamed into place, checks every copied file's size against the
checkpoint's `ok` manifest, and never writes into the run directory.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from rlrun.errors import RunDirError
from rlrun.rundir import RunDir
from rlrun.trainer import checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Exported:
    path: Path  # OUT_DIR
    checkpoint: Path  # the checkpoint copied
    step: int
    files: list[str]  # relative to `path`
    tokenizer_from: Optional[Path]  # the run's model folder, when the checkpoint had no tokenizer of its own
    warnings: list[str] = field(default_factory=list)


def export(run_root: Path, out: Path, step: Optional[int] = None) -> Exported:
    """Copy run `run_root`'s newest usable checkpoint (or that of `step`) to the new folder `out`."""
    run = RunDir(Path(run_root).expanduser().resolve())
    run.require_run()
    out = Path(out).expanduser().absolute()
    _check_out(out, run)
    warnings: list[str] = []
    source = chosen_checkpoint(run, step, warnings)
    state = checkpoint.read_state(source)
    tokenizer_from = None if checkpoint.has_tokenizer(source) else _model_folder(run)
    if not checkpoint.has_tokenizer(source):
        if tokenizer_from is None:
            warnings.append(
                f"{source.name} holds no tokenizer and the run's model folder is not here: the export has none"
            )
        else:
            warnings.append(
                f"{source.name} holds no tokenizer (written by an older rlrun): copied from the run's model folder {tokenizer_from}"
            )
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        _copy_model(source, tmp)
        if tokenizer_from is not None:
            checkpoint.copy_tokenizer(tokenizer_from, tmp)
        if out.is_dir():
            out.rmdir()  # empty: checked above
        os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunDirError(f"cannot export {source} to {out}: {exc}. Nothing was left at {out}.") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return Exported(out, source, state.step, files, tokenizer_from, warnings)


def _check_out(out: Path, run: RunDir) -> None:
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{out} is a file: give a new folder (or an empty one) to export into.")
    if out.is_dir() and any(out.iterdir()):
        raise RunDirError(
            f"{out} is not empty: give a new folder (or an empty one) to export into; nothing is overwritten."
        )
    if out.resolve() == run.root or run.root in out.resolve().parents:
        raise RunDirError(
            f"{out} is inside the run directory {run.root}: export to a folder outside it (the run's files are left as they are)."
        )


def chosen_checkpoint(run: RunDir, step: Optional[int], warnings: list[str]) -> Path:
    """The checkpoint to copy: step `step`'s if whole, else the newest a resume would load."""
    if step is not None:
        path = run.checkpoint(step)
        if not path.is_dir():
            have = (
                ", ".join(
                    str(int(p.name.removeprefix("step_")))
                    for p in sorted(run.checkpoints.glob("step_*"))
                    if p.name.removeprefix("step_").isdigit()
                )
                or "none"
            )
            raise RunDirError(f"{run.root} has no checkpoint of step {step} (checkpoints: {have}).")
        if not (path / checkpoint.OK_MARKER).is_file():
            raise RunDirError(f"{path} is half-written (no '{checkpoint.OK_MARKER}' marker): it cannot be exported.")
        why = checkpoint.problem(path)
        if why is not None:
            raise RunDirError(f"{path} is damaged: {why}. It cannot be exported; choose another --step.")
        return path
    found = checkpoint.scan(run.checkpoints)
    for path, why in found.damaged:
        warnings.append(f"skipped damaged checkpoint {path.name}: {why}")
    if found.usable is None:
        damaged = (
            f"; every complete one is damaged ({'; '.join(f'{p.name}: {w}' for p, w in found.damaged)})"
            if found.damaged
            else ""
        )
        half = f"; {len(found.half_written)} half-written one(s) skipped" if found.half_written else ""
        none = (
            ""
            if any(run.checkpoints.glob("step_*"))
            else (
                f" (none in {run.checkpoints.name}/ yet: export copies the hf trainer's checkpoints; a trainer=fast_llm run's are Fast-LLM's own format)"
            )
        )
        raise RunDirError(
            f"{run.root} has no complete checkpoint to export{damaged}{half}{none}. `rlrun inspect-checkpoint {run.root}` says more."
        )
    return found.usable


def _copy_model(source: Path, target: Path) -> None:
    """Every file of checkpoint `source` but the trainer's own, checked against its `ok` manifest
    (a file the live run prunes or rewrites meanwhile is an error, not a silent half copy)."""
    sizes = checkpoint.manifest(source)
    for path in sorted(source.rglob("*")):
        name = str(path.relative_to(source))
        if path.is_dir() or name.split("/")[0] in checkpoint.TRAINER_FILES:
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / name)
        if name in sizes and (target / name).stat().st_size != sizes[name]:
            raise RunDirError(f"{path} changed while it was copied ({sizes[name]} bytes when written): export again.")


def _model_folder(run: RunDir) -> Optional[Path]:
    """The model folder the run started from, where it is on this machine (None: not found)."""
    from rlrun.config.compose import load_resolved
    from rlrun.models.source import model_path

    try:
        cfg = load_resolved(run.config)
        if cfg.model.source == "hub":  # the hub cache's copy, never fetched here
            from huggingface_hub import snapshot_download

            assert cfg.model.path is not None  # the config's check: set unless model.source=tiny
            folder = Path(snapshot_download(cfg.model.path, local_files_only=True))
        else:
            folder = Path(model_path(cfg.model, build=False, seed=cfg.run.seed, max_operand=cfg.dataset.max_operand))
    except Exception as exc:  # noqa: BLE001 - an unreadable config, a model not here (huggingface_hub's own errors): no folder
        log.debug("no model folder for %s: %s", run.root, exc)
        return None
    return folder if checkpoint.has_tokenizer(folder) else None
