"""Rows from files: JSONL, Parquet, CSV, or a `datasets` folder saved to disk (a hub name where the
hub is reachable). A row is a plain dict of its columns; nothing here knows prompts or rewards.

Every failure is a `TaskInputError` naming the file, and the line or column where it can.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rlrun.errors import ConfigError

Row = dict[str, Any]
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}


class TaskInputError(ConfigError):
    """The task's files, columns, template or reward functions cannot be used (exit 2)."""


def read_rows(spec: str, split: str) -> list[Row]:
    """Every row of `spec` in file order; `split` picks one of a `datasets` folder or hub dataset."""
    path = Path(spec).expanduser()
    if path.is_dir():
        rows = _datasets_folder(path, split)
    elif path.is_file():
        kind = FORMATS.get(path.suffix.lower())
        if kind is None:
            raise TaskInputError(
                f"{spec}: rlrun reads .jsonl, .parquet and .csv files or a `datasets` folder, not {path.suffix or 'a file without a suffix'}."
            )
        rows = {"jsonl": _jsonl, "parquet": _parquet, "csv": _csv}[kind](path)
    elif _looks_like_hub_name(spec):
        rows = _hub(spec, split)
    else:
        raise TaskInputError(f"{spec}: no such file or folder (paths are relative to where rlrun runs: {Path.cwd()}).")
    if not rows:
        raise TaskInputError(f"{spec}: it holds no rows. Give a file with at least one problem.")
    return rows


def _jsonl(path: Path) -> list[Row]:
    rows = []
    for number, line in enumerate(_text(path).split("\n"), 1):  # not splitlines(): U+2028 may sit inside a JSON string
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise TaskInputError(
                f"{path}, line {number}: not JSON ({exc}). Each line must be one JSON object."
            ) from None
        if not isinstance(row, dict):
            raise TaskInputError(f"{path}, line {number}: a JSON {type(row).__name__}, not an object of columns.")
        rows.append(row)
    return rows


def _parquet(path: Path) -> list[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskInputError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow.") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise TaskInputError(f"{path}: not a readable Parquet file ({exc}).") from None


def _csv(path: Path) -> list[Row]:
    reader = csv.DictReader(io.StringIO(_text(path), newline=""))
    rows = []
    for number, row in enumerate(reader, 2):
        if None in row:  # more cells than the header names
            raise TaskInputError(
                f"{path}, line {number}: {len(row) - 1 + len(row[None])} cells for {len(reader.fieldnames or [])} columns."
            )
        rows.append(dict(row))
    return rows


def _text(path: Path) -> str:
    """The file's text: UTF-8, without the byte-order mark spreadsheets write first."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TaskInputError(
            f"{path}, line {line}: not UTF-8 text ({exc.reason} at byte {exc.start}). Save the file as UTF-8."
        ) from None


def _datasets_folder(path: Path, split: str) -> list[Row]:
    datasets = _require_datasets(str(path))
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - datasets raises many types; all mean "not a saved dataset"
        raise TaskInputError(f"{path}: not a folder saved by `datasets` (save_to_disk) ({exc}).") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise TaskInputError(
                f"{path}: no split {split!r}; it has {', '.join(loaded)}. Set dataset.split (or dataset.eval_split)."
            )
        loaded = loaded[split]
    return loaded.to_list()


def _hub(name: str, split: str) -> list[Row]:
    datasets = _require_datasets(name)
    try:
        return datasets.load_dataset(name, split=split).to_list()
    except Exception as exc:  # noqa: BLE001
        raise TaskInputError(f"{name}: neither a local path nor a hub dataset that loads here ({exc}).") from None


def _require_datasets(what: str):
    try:
        import datasets
    except ImportError:
        raise TaskInputError(
            f"{what}: a `datasets` folder or hub name needs the datasets package: pip install datasets."
        ) from None
    return datasets


def _looks_like_hub_name(spec: str) -> bool:
    return "/" in spec and not spec.startswith(("/", ".", "~")) and Path(spec).suffix.lower() not in FORMATS
