"""rlrun's model cache: a model folder is built once, whoever asks for it first.

Concurrent runs and tests wait on one lock per folder; the build goes into a temporary sibling
that is renamed into place with its marker written last, so a crashed build never looks finished
and is cleared by the next caller."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from filelock import FileLock

MARKER = "rlrun-model.json"  # written last by a build; a folder without it is not a finished build


def built_once(
    cache_dir: str | Path, name: str, build: Callable[[Path], None], before_build: Callable[[], None] = lambda: None
) -> Path:
    """`cache_dir/name`, made first by `build(tmp_folder)` if it is not there yet (`build` writes
    MARKER last). `before_build`: checks worth running only when a build is needed."""
    cache_dir = Path(cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / name
    if (final / MARKER).is_file():
        return final
    before_build()
    with FileLock(cache_dir / f".{name}.lock"):
        if (final / MARKER).is_file():  # another caller built it while we waited
            return final
        for stale in cache_dir.glob(f".{name}.tmp-*"):  # left by a crashed build
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # no marker: not ours to trust
            shutil.rmtree(final)
        tmp = cache_dir / f".{name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            build(tmp)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
