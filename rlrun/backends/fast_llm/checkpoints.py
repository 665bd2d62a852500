"""Fast-LLM's checkpoint layout, read by rlrun, and half-written checkpoints moved out of its way.

`<experiment_dir>/checkpoint/<step>/`: `metadata.yaml` (`completed_steps`, `documents_seen`) and an
empty `ok` last. A half-written one makes every restart of Fast-LLM fail: `move_aside_incomplete`
moves it to `checkpoint_incomplete/` (never deletes), only while Fast-LLM is stopped.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoint"
LEGACY_CHECKPOINT_DIR = "checkpoints"
INCOMPLETE_DIR = "checkpoint_incomplete"
OK_MARKER = "ok"
METADATA_FILE = "metadata.yaml"


class CheckpointError(ValueError):
    """A Fast-LLM checkpoint whose metadata cannot be read."""


@dataclass(frozen=True)
class CheckpointMetadata:
    completed_steps: int  # optimizer steps done when the checkpoint was written
    documents_seen: Optional[int] = None  # documents consumed by then (None when not recorded)


def checkpoint_root(experiment_dir: Path) -> Path:
    """Where Fast-LLM writes checkpoints for this experiment directory (its own rule)."""
    experiment_dir = Path(experiment_dir)
    legacy, current = experiment_dir / LEGACY_CHECKPOINT_DIR, experiment_dir / CHECKPOINT_DIR
    return legacy if legacy.is_dir() and not current.is_dir() else current


def is_complete(path: Path) -> bool:
    return (Path(path) / OK_MARKER).is_file()


def step_dirs(experiment_dir: Path) -> list[tuple[int, Path]]:
    root = checkpoint_root(experiment_dir)
    if not root.is_dir():
        return []
    found = [(int(p.name), p) for p in root.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found)


def latest_complete(experiment_dir: Path) -> Optional[Path]:
    complete = [path for _, path in step_dirs(experiment_dir) if is_complete(path)]
    return complete[-1] if complete else None


def latest_complete_step(experiment_dir: Path) -> Optional[int]:
    """The step of `latest_complete`, or None: an input of the fast_llm completion rule."""
    path = latest_complete(experiment_dir)
    return None if path is None else int(path.name)


def read_metadata(path: Path) -> CheckpointMetadata:
    file = Path(path) / METADATA_FILE
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CheckpointError(f"cannot read Fast-LLM checkpoint metadata {file}: {exc}") from None
    trainer = data.get("metadata") if isinstance(data, dict) else None
    if not isinstance(trainer, dict):
        raise CheckpointError(
            f"{file} has no `metadata:` mapping (the trainer's completed_steps): not a Fast-LLM checkpoint"
        )
    steps, seen = trainer.get("completed_steps"), trainer.get("documents_seen")
    if type(steps) is not int or steps < 0:
        raise CheckpointError(f"{file}: completed_steps must be a count, got {steps!r}")
    if seen is not None and (type(seen) is not int or seen < 0):
        raise CheckpointError(f"{file}: documents_seen must be a count, got {seen!r}")
    return CheckpointMetadata(completed_steps=steps, documents_seen=seen)


def move_aside_incomplete(experiment_dir: Path, *, clock: Callable[[], float] = time.time) -> list[Path]:
    """Move every step directory without `ok` to `checkpoint_incomplete/<step>.incomplete-<time>`;
    their new paths. Other entries are only warned about (Fast-LLM fails on them; not ours to move)."""
    experiment_dir = Path(experiment_dir)
    root = checkpoint_root(experiment_dir)
    if not root.is_dir():
        return []
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(clock()))
    moved = []
    for step, path in step_dirs(experiment_dir):
        if is_complete(path):
            continue
        target = _free_name(experiment_dir / INCOMPLETE_DIR, f"{step}.incomplete-{stamp}")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, target)
        log.warning(
            "Fast-LLM checkpoint %s has no '%s' marker (half-written): moved to %s; the trainer "
            "resumes from the last complete checkpoint",
            path,
            OK_MARKER,
            target,
        )
        moved.append(target)
    strays = [p.name for p in root.iterdir() if not (p.is_dir() and p.name.isdigit())]
    if strays:
        log.warning(
            "%s holds entries that are not step directories (%s): Fast-LLM fails on them; move them out of that folder",
            root,
            ", ".join(sorted(strays)),
        )
    return moved


def _free_name(folder: Path, name: str) -> Path:
    candidate, n = folder / name, 1
    while candidate.exists():
        candidate, n = folder / f"{name}-{n}", n + 1
    return candidate
