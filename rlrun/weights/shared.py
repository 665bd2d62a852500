"""Weights through shared memory (trainer.weight_transfer=shm): one file mapped by the trainer and
by every vLLM worker on its host (bench/notes/shm-weight-transfer.md).

The writer lays a state dict out once (per tensor: name, dtype, shape, a 64-byte aligned offset;
`<path>.json` beside the file, renamed into place), then copies each step's tensors into their
views: pages that exist already, no serialisation. A reader maps the same file and hands out views
of it, no copy. Who writes when: the trainer writes only between two updates, and a server reads
only inside its update, so no read sees a write.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

ALIGN = 64
SHM = Path("/dev/shm")  # tmpfs: memory, not disk


def shared_path(prefix: str, folder: Path = SHM) -> Path:
    """The run's shared weights file; `prefix`: the run's key prefix (`listen.run_prefix`), so two
    runs on one host never share one."""
    return Path(folder) / f"rlrun-{prefix.strip('/')}-weights"


def without_aliases(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without the entries that are another entry's tensor (tied weights: the first name
    kept, as safetensors keeps one; vLLM's loader ties them again)."""
    seen, kept = set(), {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.data_ptr() == 0 or key not in seen:
            kept[name] = tensor
            seen.add(key)
    return kept


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # torch's name, e.g. "float32"
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()


def layout_of(state: dict[str, torch.Tensor]) -> list[Entry]:
    """Every tensor of `state` at an aligned offset, in order."""
    entries, offset = [], 0
    for name, tensor in state.items():
        entry = Entry(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset)
        entries.append(entry)
        offset += -(-entry.nbytes // ALIGN) * ALIGN
    return entries


def size_of(layout: list[Entry]) -> int:
    return max((e.offset + e.nbytes for e in layout), default=0)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _views(buffer: torch.Tensor, layout: list[Entry]) -> dict[str, torch.Tensor]:
    return {e.name: buffer[e.offset : e.offset + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape) for e in layout}


def _map(path: Path, size: int) -> torch.Tensor:
    return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)


class SharedWeights:
    """The trainer's side: `write(state)` copies a state dict into the file at `path` (created, mode
    0600, with the layout of the first state written; a later state must have the same layout)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.layout: list[Entry] | None = None
        self._views: dict[str, torch.Tensor] = {}

    @property
    def views(self) -> dict[str, torch.Tensor]:
        """The file's tensors as written last (the same dict each time until the file is made anew)."""
        return self._views

    def write(self, state: dict[str, torch.Tensor]) -> int:
        """Copy every tensor of `state` into its place; the bytes written."""
        if self.layout is None:
            self._create(layout_of(state))
        elif [(e.name, e.dtype, e.shape) for e in layout_of(state)] != [
            (e.name, e.dtype, e.shape) for e in self.layout
        ]:
            raise ValueError(f"the weights no longer have the layout of {self.path} (names, dtypes or shapes changed)")
        with torch.no_grad():
            for name, tensor in state.items():
                self._views[name].copy_(tensor.detach())
        assert self.layout is not None  # set by _create
        return sum(e.nbytes for e in self.layout)

    def _create(self, layout: list[Entry]) -> None:
        from rlrun.errors import ConfigError

        size = size_of(layout)
        self.path.unlink(missing_ok=True)
        free = shutil.disk_usage(self.path.parent).free
        if free < size:
            raise ConfigError(
                f"trainer.weight_transfer=shm: {self.path.parent} has {free / 1e6:.0f} MB free, the weights need "
                f"{size / 1e6:.0f} MB. Give the machine (a container: --shm-size) more shared memory, or use "
                "trainer.weight_transfer=disk."
            )
        os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
        self._views = _views(_map(self.path, size), layout)
        text = json.dumps({"size": size, "tensors": [[e.name, e.dtype, list(e.shape), e.offset] for e in layout]})
        tmp = self.path.with_name(self.path.name + ".json.tmp")
        tmp.write_text(text)
        tmp.rename(layout_path(self.path))
        self.layout = layout

    def close(self) -> None:
        """Remove the file and its layout (a reader's mapping stays valid until it lets it go)."""
        self._views = {}
        for path in (self.path, layout_path(self.path)):
            path.unlink(missing_ok=True)


def layout_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".json")


def read_layout(path: Path) -> tuple[int, list[Entry]]:
    data = json.loads(layout_path(path).read_text())
    return int(data["size"]), [
        Entry(name, dtype, tuple(shape), int(offset)) for name, dtype, shape, offset in data["tensors"]
    ]


class SharedReader:
    """A vLLM worker's side: the file mapped once (again when it is another file: a restarted
    trainer made it anew), its tensors as views."""

    def __init__(self) -> None:
        self._mapped: tuple[tuple[str, int, int], dict[str, torch.Tensor]] | None = None

    def tensors(self, path: str) -> Iterator[tuple[str, torch.Tensor]]:
        stat = os.stat(path)
        identity = (path, stat.st_ino, stat.st_size)
        if self._mapped is None or self._mapped[0] != identity:
            size, layout = read_layout(Path(path))
            if size != stat.st_size:
                raise RuntimeError(f"{path} holds {stat.st_size} bytes, its layout {size}")
            self._mapped = identity, _views(_map(Path(path), size), layout)
        return iter(self._mapped[1].items())
