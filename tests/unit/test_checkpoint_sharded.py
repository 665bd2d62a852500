"""A checkpoint written by several trainer ranks (optimizer/ from torch.distributed.checkpoint):
`problem` vouches for every shard through the `ok` manifest, so resume and inspect-checkpoint
skip a damaged one exactly as they skip a damaged one-rank checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from rlrun.cli import inspection
from rlrun.trainer import checkpoint


def sharded(checkpoints: Path, step: int) -> Path:
    """What `checkpoint.save` leaves with 2 ranks, sealed by its own `_seal` (state, rename, ok)."""
    tmp = checkpoints / f".tmp-step_{step:06d}"
    (tmp / checkpoint.OPTIMIZER_DIR).mkdir(parents=True)
    save_file({"lm_head.weight": torch.zeros(4, 8)}, tmp / "model.safetensors")
    (tmp / "config.json").write_text('{"model_type": "qwen2"}\n')
    for name, size in ((checkpoint.DCP_METADATA, 300), ("__0_0.distcp", 1000), ("__1_0.distcp", 1000)):
        (tmp / checkpoint.OPTIMIZER_DIR / name).write_bytes(b"\1" * size)
    checkpoint._seal(tmp, checkpoints / f"step_{step:06d}", checkpoint.TrainerState(step, 8 * step, step))
    return checkpoints / f"step_{step:06d}"


def test_a_whole_sharded_checkpoint_is_usable_and_its_manifest_names_every_shard(tmp_path):
    path = sharded(tmp_path, 2)
    assert checkpoint.problem(path) is None
    assert checkpoint.resume_point(tmp_path) == path
    manifest = json.loads((path / checkpoint.OK_MARKER).read_text())["files"]
    assert {"optimizer/.metadata", "optimizer/__0_0.distcp", "optimizer/__1_0.distcp", "model.safetensors"} <= set(manifest)
    listed = {f.name for f in inspection.list_files(path)}
    assert {"optimizer/__0_0.distcp", "optimizer/__1_0.distcp"} <= listed


def test_a_truncated_shard_makes_resume_fall_back_to_the_previous_checkpoint(tmp_path):
    older, newer = sharded(tmp_path, 2), sharded(tmp_path, 4)
    with open(newer / "optimizer" / "__1_0.distcp", "r+b") as f:
        f.truncate(10)
    assert "optimizer/__1_0.distcp holds 10 bytes, 1000 when it was written" in checkpoint.problem(newer)
    assert checkpoint.resume_point(tmp_path) == older


def test_a_sharded_checkpoint_without_its_metadata_is_damaged(tmp_path):
    path = sharded(tmp_path, 2)
    (path / "optimizer" / checkpoint.DCP_METADATA).unlink()
    assert checkpoint.problem(path) == "optimizer/.metadata is missing"
