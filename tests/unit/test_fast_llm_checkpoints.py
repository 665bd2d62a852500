"""Fast-LLM's checkpoint layout: the latest complete one, its metadata, half-written ones moved aside."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from rlrun.backends.fast_llm.checkpoints import (
    CheckpointError,
    CheckpointMetadata,
    checkpoint_root,
    latest_complete,
    latest_complete_step,
    move_aside_incomplete,
    read_metadata,
)


def _checkpoint(experiment: Path, step: int, ok: bool = True, documents_seen: int | None = None, folder: str = "checkpoint") -> Path:
    path = experiment / folder / str(step)
    path.mkdir(parents=True)
    metadata = {"completed_steps": step}
    if documents_seen is not None:
        metadata["documents_seen"] = documents_seen
    (path / "metadata.yaml").write_text(yaml.safe_dump({"metadata": metadata}))  # nested, as Fast-LLM writes it
    if ok:
        (path / "ok").touch()
    return path


def test_latest_complete_skips_half_written_and_orders_by_number(tmp_path):
    assert latest_complete(tmp_path) is None and latest_complete_step(tmp_path) is None
    _checkpoint(tmp_path, 2)
    ten = _checkpoint(tmp_path, 10)  # 10 > 9 numerically, although "10" < "9" as text
    _checkpoint(tmp_path, 9)
    _checkpoint(tmp_path, 12, ok=False)
    assert latest_complete(tmp_path) == ten and latest_complete_step(tmp_path) == 10


def test_read_metadata_with_and_without_documents_seen(tmp_path):
    assert read_metadata(_checkpoint(tmp_path, 4, documents_seen=4172)) == CheckpointMetadata(4, 4172)
    assert read_metadata(_checkpoint(tmp_path, 5)) == CheckpointMetadata(5, None)
    bad = _checkpoint(tmp_path, 6)
    (bad / "metadata.yaml").write_text("metadata:\n  completed_steps: six\n")
    with pytest.raises(CheckpointError, match="completed_steps"):
        read_metadata(bad)
    (bad / "metadata.yaml").write_text("completed_steps: 6\n")  # not nested: not what Fast-LLM writes
    with pytest.raises(CheckpointError, match="metadata"):
        read_metadata(bad)
    with pytest.raises(CheckpointError):
        read_metadata(tmp_path / "nowhere")


def test_incomplete_checkpoints_are_moved_aside_never_deleted(tmp_path, caplog):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    six = _checkpoint(tmp_path, 6, ok=False)
    (six / "weights.bin").write_bytes(b"partial")
    _checkpoint(tmp_path, 3, ok=False)
    with caplog.at_level(logging.WARNING):
        moved = move_aside_incomplete(tmp_path, clock=lambda: 0.0)
    assert [p.name for p in moved] == ["3.incomplete-19700101T000000", "6.incomplete-19700101T000000"]
    assert all(p.parent == tmp_path / "checkpoint_incomplete" for p in moved)
    assert (moved[1] / "weights.bin").read_bytes() == b"partial"
    # What Fast-LLM does on start now works: every entry is a step number, the highest has `ok`.
    names = [p.name for p in (tmp_path / "checkpoint").iterdir()]
    assert sorted(int(n) for n in names) == [2, 4]
    assert latest_complete_step(tmp_path) == 4
    assert "6" in caplog.text and "no 'ok' marker" in caplog.text
    assert move_aside_incomplete(tmp_path) == []


def test_moving_aside_twice_at_the_same_second_keeps_both(tmp_path):
    _checkpoint(tmp_path, 6, ok=False)
    first = move_aside_incomplete(tmp_path, clock=lambda: 0.0)
    _checkpoint(tmp_path, 6, ok=False)
    second = move_aside_incomplete(tmp_path, clock=lambda: 0.0)
    assert first[0] != second[0] and first[0].is_dir() and second[0].is_dir()


def test_stray_entries_are_reported_not_moved(tmp_path, caplog):
    _checkpoint(tmp_path, 1)
    (tmp_path / "checkpoint" / "notes.txt").write_text("x")
    with caplog.at_level(logging.WARNING):
        assert move_aside_incomplete(tmp_path) == []
    assert (tmp_path / "checkpoint" / "notes.txt").exists() and "notes.txt" in caplog.text


def test_legacy_checkpoints_folder_is_used_when_it_is_the_only_one(tmp_path):
    _checkpoint(tmp_path, 3, folder="checkpoints")
    assert checkpoint_root(tmp_path) == tmp_path / "checkpoints"
    assert latest_complete_step(tmp_path) == 3
    _checkpoint(tmp_path, 1)
    assert checkpoint_root(tmp_path) == tmp_path / "checkpoint"
