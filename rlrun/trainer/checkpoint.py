"""The hf trainer's checkpoints: written atomically, an `ok` marker last, read back safely.

`<run>/checkpoints/step_000050/`: a whole Hugging Face model folder (the weights, and the tokenizer
and chat template of the model folder the run started from: transformers and vLLM load it alone),
the optimizer (`optimizer.pt` from one rank, `optimizer/` from several: either loads with any number
of ranks), `trainer_state.json`, and `ok` (every file's size) after the rename. `resume_point` skips a
half-written or damaged one (`problem`: no tensor loaded) and refuses (CorruptCheckpoint) when only
damaged ones are left, rather than train again from the base model.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
import zipfile
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from rlrun.errors import RunDirError
from rlrun.trainer.disk import temporary_folder

log = logging.getLogger(__name__)

OK_MARKER = "ok"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"  # written by one rank
OPTIMIZER_DIR = "optimizer"  # written by several (torch.distributed.checkpoint)
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index, written after every shard
TRAINER_FILES = (OK_MARKER, STATE_FILE, OPTIMIZER_FILE, OPTIMIZER_DIR)  # the rest of a checkpoint is the HF model
# A model folder's tokenizer and chat templates, as transformers saves them (whichever a tokenizer has).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
CHAT_TEMPLATES_DIR = "additional_chat_templates"  # transformers' named chat templates, a .jinja each


@dataclass(frozen=True)
class TrainerState:
    step: int  # optimizer steps taken
    samples_processed: int
    policy_version: int  # the version vLLM serves after this step's weight update
    written_at: float = 0.0
    config_hash: str = ""
    # Per groups stream, what the steps taken read: [last entry id, entries up to it]
    # (rlrun/trainer/intake.py). None: written before positions were recorded.
    stream_positions: Optional[dict[str, list]] = None


class CorruptCheckpoint(RunDirError):
    """Every checkpoint that says it is complete is damaged: there is nothing safe to resume from."""


def is_complete(path: Path) -> bool:
    return (path / OK_MARKER).is_file() and (path / STATE_FILE).is_file()


@dataclass(frozen=True)
class Scan:
    """What a (re)started trainer finds among its checkpoints: the one rule of which it loads."""

    usable: Optional[Path]  # the newest complete, undamaged checkpoint
    damaged: list[tuple[Path, str]]  # complete but damaged and newer than `usable`, newest first, with why
    half_written: list[Path]  # no `ok` marker and newer than `usable`, newest first


def scan(checkpoints: Path) -> Scan:
    corrupt: list[tuple[Path, str]] = []
    half: list[Path] = []
    folders = (
        sorted((p for p in checkpoints.glob("step_*") if p.is_dir()), reverse=True) if checkpoints.is_dir() else []
    )
    for path in folders:
        if not (path / OK_MARKER).is_file():
            log.warning("skipping half-written checkpoint %s (no '%s' marker)", path, OK_MARKER)
            half.append(path)
            continue
        why = problem(path)
        if why is None:
            return Scan(path, corrupt, half)
        log.warning("skipping damaged checkpoint %s: %s; falling back to an older one", path, why)
        corrupt.append((path, why))
    return Scan(None, corrupt, half)


def latest_complete(checkpoints: Path) -> Optional[Path]:
    """The highest-step complete and undamaged checkpoint; others are skipped with a warning."""
    return scan(checkpoints).usable


def resume_point(checkpoints: Path) -> Optional[Path]:
    """The checkpoint a (re)started trainer loads (None: the base model); CorruptCheckpoint when
    complete checkpoints exist but every one of them is damaged."""
    found = scan(checkpoints)
    if found.usable is None and found.damaged:
        listed = "; ".join(f"{p.name}: {why}" for p, why in found.damaged)
        raise CorruptCheckpoint(
            f"no usable checkpoint in {checkpoints}: every complete one is damaged ({listed}). "
            f"Restore the damaged files from a copy, or move those folders out of {checkpoints} "
            f"to train again from the base model."
        )
    return found.usable


def problem(path: Path) -> Optional[str]:
    """Why the complete checkpoint at `path` cannot be loaded (None: whole): sizes against the `ok`
    manifest, the JSON files, safetensors headers, optimizer.pt's zip directory; never a tensor."""
    unreadable = (
        OSError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        zipfile.BadZipFile,
    )  # JSON errors are ValueErrors

    def reading(name: str, check) -> Optional[str]:
        try:
            return check()
        except unreadable as exc:
            return f"{name} is unreadable ({type(exc).__name__}: {exc})"

    def sizes() -> Optional[str]:
        for name, size in manifest(path).items():
            if not (path / name).is_file():
                return f"{name} is missing"
            if (path / name).stat().st_size != size:
                return f"{name} holds {(path / name).stat().st_size} bytes, {size} when it was written (truncated or overwritten)"
        return None

    def state() -> Optional[str]:
        recorded = read_state(path)
        for name in ("step", "samples_processed", "policy_version"):
            value = getattr(recorded, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        stream_positions(recorded)
        step = path.name.removeprefix("step_")
        if step.isdigit() and int(step) != recorded.step:
            return f"{STATE_FILE} says step {recorded.step} but the folder is {path.name}"
        return None

    def config() -> Optional[str]:
        if not isinstance(json.loads((path / "config.json").read_text()), dict):
            return "config.json is not a JSON object"
        return None

    def optimizer() -> None:
        with zipfile.ZipFile(path / OPTIMIZER_FILE):  # torch.save writes a zip; a truncated one has no directory
            return None

    sharded = (path / OPTIMIZER_DIR).is_dir()
    optimizer_file = f"{OPTIMIZER_DIR}/{DCP_METADATA}" if sharded else OPTIMIZER_FILE
    for name in (STATE_FILE, "config.json", optimizer_file):
        if not (path / name).is_file():
            return f"{name} is missing"
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        return "no model weights (*.safetensors)"
    checks = [(OK_MARKER, sizes), (STATE_FILE, state), ("config.json", config)]
    if not sharded:  # the sharded one's files are covered by the manifest's sizes
        checks.append((OPTIMIZER_FILE, optimizer))
    checks += [(file.name, functools.partial(_safetensors_problem, file)) for file in weights]
    for name, check in checks:
        why = reading(name, check)
        if why:
            return why
    return None


def manifest(path: Path) -> dict[str, int]:
    """File sizes recorded in the `ok` marker ({} for a marker written before it had them)."""
    text = (path / OK_MARKER).read_text()
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, int) for v in files.values()):
        raise ValueError(f"the '{OK_MARKER}' marker is not a manifest: {text[:80]!r}")
    return files


def _safetensors_problem(file: Path) -> Optional[str]:
    """Why `file` is not a whole safetensors file: 8-byte header length, JSON header, then data
    exactly as long as the header's largest end offset."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{file.name} is truncated ({size} bytes, no header)"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"{file.name} is truncated or not safetensors (header of {length} bytes in a file of {size})"
        header = json.loads(handle.read(length))
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"{file.name} is truncated ({size} bytes, its header describes {expected})"
    return None


def read_state(path: Path) -> TrainerState:
    return TrainerState(**json.loads((path / STATE_FILE).read_text()))


def stream_positions(state: TrainerState):
    """The groups streams' positions the checkpoint covers ({stream: intake.Position}); None when
    it records none (written by an older rlrun). ValueError when they are malformed."""
    from rlrun.trainer.intake import Position

    if state.stream_positions is None:
        return None
    if not isinstance(state.stream_positions, dict):
        raise ValueError(f"stream_positions must be a mapping, got {state.stream_positions!r}")
    return {stream: Position.from_json(value) for stream, value in state.stream_positions.items()}


def copy_tokenizer(source: Path, target: Path) -> list[str]:
    """Copy model folder `source`'s tokenizer files and chat templates into `target`: the names
    copied (none when it has none). Links (the hub cache's) are copied as the files they name."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
            copied.append(name)
    if (source / CHAT_TEMPLATES_DIR).is_dir():
        shutil.copytree(source / CHAT_TEMPLATES_DIR, target / CHAT_TEMPLATES_DIR, dirs_exist_ok=True)
        copied.append(CHAT_TEMPLATES_DIR)
    return copied


def has_tokenizer(path: Path) -> bool:
    """Whether a model folder holds a tokenizer transformers can load (checkpoints written before
    they carried one do not)."""
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def save(
    model, optimizer, state: TrainerState, final: Path, keep: int, parallel, tokenizer_from: Optional[Path] = None
) -> None:
    """Write a checkpoint atomically into `final`, then prune all but the newest `keep`. With several
    ranks every rank calls it: each writes its optimizer shard, rank 0 the rest and `ok` last.
    `tokenizer_from`: the model folder the run started from, whose tokenizer and chat template the
    checkpoint carries (rlrun's trainer always gives it)."""
    import torch

    distributed, main = parallel.ranks.distributed, parallel.ranks.is_main
    tmp = final.with_name(f".tmp-{final.name}")
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if distributed:
        parallel.barrier()  # the folder exists before any rank writes into it
    weights = parallel.full_state_dict(model)  # every rank takes part
    with temporary_folder(tmp) if main else nullcontext():  # rank 0: removed if the write fails
        if main:
            parallel.unwrapped(model).save_pretrained(tmp, state_dict=weights, safe_serialization=True)
            if tokenizer_from is not None:
                copy_tokenizer(Path(tokenizer_from), tmp)
        if distributed:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            # Returns on rank 0 once every rank's shard and the metadata are written.
            dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=tmp / OPTIMIZER_DIR)
        else:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        if main:
            _seal(tmp, final, state)
    if main:
        _prune(final.parent, keep)
    if distributed:
        parallel.barrier()  # no rank goes on before the checkpoint is complete


def _seal(tmp: Path, final: Path, state: TrainerState) -> None:
    """Rank 0, once every part is written: the state, the rename, then the `ok` manifest."""
    state = TrainerState(**{**asdict(state), "written_at": time.time()})
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)  # a half-written leftover of an earlier attempt at this step
    os.replace(tmp, final)
    sizes = {str(p.relative_to(final)): p.stat().st_size for p in sorted(final.rglob("*")) if p.is_file()}
    with open(final / OK_MARKER, "w") as marker:
        marker.write(json.dumps({"files": sizes}, indent=1) + "\n")
        marker.flush()
        os.fsync(marker.fileno())


def _prune(checkpoints: Path, keep: int) -> None:
    complete = sorted(p for p in checkpoints.glob("step_*") if is_complete(p))
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_optimizer(optimizer, path: Path, model, parallel) -> None:
    """Load the optimizer state of checkpoint `path`, written by one rank or several, into this
    rank's optimizer (whole, or its shard under FSDP2)."""
    import torch

    if (path / OPTIMIZER_DIR).is_dir():
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        wanted = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the shapes this rank holds
        dcp.load(wanted, checkpoint_id=path / OPTIMIZER_DIR)  # resharded to them, whatever wrote it
        set_optimizer_state_dict(model, optimizer, wanted["optimizer"])
        return
    saved = torch.load(path / OPTIMIZER_FILE, weights_only=True)
    if parallel.sharding == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        # One rank's file names parameters by position; the sharded optimizer wants their names.
        names = [name for name, _ in parallel.unwrapped(model).named_parameters()]
        full: dict[str, Any] = {
            "state": {names[i]: value for i, value in saved["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]],
        }
        set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))
        return
    optimizer.load_state_dict(saved)
