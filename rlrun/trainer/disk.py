"""The trainer's folder writes (weights handed to vLLM, checkpoints) on a disk that may fill up:
a temporary folder that is removed whatever goes wrong in it, and a full disk said as such.

torch and safetensors do not raise OSError on a full disk (a RuntimeError "unexpected pos", a
SafetensorError quoting the OS): a failed write is taken as a full disk when the OS error says so
anywhere in the chain, or when its filesystem has less than LOW_SPACE left as it fails.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from rlrun.errors import RunDirError

LOW_SPACE = 16 << 20  # bytes left on a filesystem whose write just failed: it is full
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RunDirError):
    """The disk holding the run is full: a restart would fail the same way (the trainer exits 2)."""


@contextmanager
def temporary_folder(tmp: Path) -> Iterator[Path]:
    """`tmp`, written in the block and renamed into place by the caller; removed when the block
    fails (DiskFull raised instead when the disk is full), so no half-written folder stays behind."""
    try:
        yield tmp
    except BaseException as exc:
        free = _free_bytes(tmp.parent)  # before the cleanup gives the partial write's space back
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception) and (_says_full(exc) or (free is not None and free < LOW_SPACE)):
            raise DiskFull(full_message(tmp.parent, free)) from exc
        raise


def full_message(folder: Path, free: Optional[int]) -> str:
    left = "" if free is None else f" ({free // (1 << 20)} MiB left)"
    return (
        f"the disk holding {folder} is full{left}: the trainer cannot write its weights or checkpoints. "
        f"Its temporary folder was removed. Free some space, then continue with `rlrun resume`."
    )


def _says_full(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if "No space left on device" in str(current) or "Disk quota exceeded" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _free_bytes(folder: Path) -> Optional[int]:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None
