"""Whether vLLM has work, told by the actors to a trainer on the same host
(`world.cpu_affinity=by_need`): one byte per actor in a small file both map, 1 while the actor
has a generation request in flight. The actors write their byte on every change; the trainer
reads them between layers (`rlrun/trainer/core_share.py`) to run on the vLLM servers' cores too
while those idle. A page of the page cache, never synced: nothing here outlives the launch.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path


class GenerationFlags:
    def __init__(self, path: Path, actors: int) -> None:
        """Map `path`, made `actors` bytes long (zeros: nobody generating) if it is shorter."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < actors:
                os.ftruncate(fd, actors)
            self._map = mmap.mmap(fd, actors)
        finally:
            os.close(fd)
        self._actors = actors

    def set(self, actor: int, busy: bool) -> None:
        self._map[actor] = 1 if busy else 0

    def any_busy(self) -> bool:
        return any(self._map[: self._actors])

    def close(self) -> None:
        self._map.close()
