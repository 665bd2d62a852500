"""The hf trainer's checkpoints: written atomically, an `ok` marker last, read back safely.

Layout: `<run>/checkpoints/step_000050/` with the model (safetensors), `optimizer.pt` (tensors
only, loaded with weights_only=True), `trainer_state.json`, and `ok`. A folder is written under a
temporary name and renamed; the `ok` marker is written after the rename, so a folder without
`ok` is a half-written checkpoint and is never loaded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

OK_MARKER = "ok"
STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class TrainerState:
    step: int  # optimizer steps taken
    samples_processed: int
    policy_version: int  # the version vLLM serves after this step's weight update
    written_at: float = 0.0
    config_hash: str = ""


def is_complete(path: Path) -> bool:
    return (path / OK_MARKER).is_file() and (path / STATE_FILE).is_file()


def latest_complete(checkpoints: Path) -> Optional[Path]:
    """The highest-step complete checkpoint; half-written ones are skipped with a warning."""
    if not checkpoints.is_dir():
        return None
    found = sorted(p for p in checkpoints.glob("step_*") if p.is_dir())
    for path in reversed(found):
        if is_complete(path):
            return path
        log.warning("skipping half-written checkpoint %s (no '%s' marker)", path, OK_MARKER)
    return None


def read_state(path: Path) -> TrainerState:
    return TrainerState(**json.loads((path / STATE_FILE).read_text()))


def save(model, optimizer, state: TrainerState, final: Path, keep: int) -> None:
    """Write a checkpoint atomically into `final`, then prune all but the newest `keep`."""
    import torch

    tmp = final.with_name(f".tmp-{final.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    state = TrainerState(**{**asdict(state), "written_at": time.time()})
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")
    if final.exists():  # a half-written leftover of an earlier attempt at the same step
        shutil.rmtree(final)
    os.replace(tmp, final)
    with open(final / OK_MARKER, "w") as marker:
        marker.write("ok\n")
        marker.flush()
        os.fsync(marker.fileno())
    _prune(final.parent, keep)


def _prune(checkpoints: Path, keep: int) -> None:
    complete = sorted(p for p in checkpoints.glob("step_*") if is_complete(p))
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_optimizer(optimizer, path: Path) -> None:
    import torch

    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
