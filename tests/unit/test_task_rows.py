"""Rows from the researcher's files (rlrun/task/rows.py): every format gives the same rows in file
order, and every unreadable input is a TaskInputError (exit 2) naming the file and where in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlrun.errors import ExitCode
from rlrun.task.rows import TaskInputError, read_rows

ROWS = [
    {"prompt": "1+2=", "answer": "3", "level": 1},
    {"prompt": "2+2=", "answer": "4", "level": 2},
    {"prompt": "9+1=", "answer": "10", "level": 3},
]


def refused(spec: str, *fragments: str, split: str = "train") -> str:
    with pytest.raises(TaskInputError) as info:
        read_rows(spec, split)
    message = str(info.value)
    assert info.value.exit_code == ExitCode.USAGE
    for fragment in fragments:
        assert fragment in message, message
    return message


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- every format ---------------------------------------------------------------------------


def test_jsonl_rows_in_file_order_blank_lines_skipped(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n   \n" + json.dumps(ROWS[1]) + "\n" + json.dumps(ROWS[2]))  # no final newline
    assert read_rows(str(path), "train") == ROWS


def test_a_json_suffix_is_read_as_json_lines(tmp_path):
    assert read_rows(str(write_jsonl(tmp_path / "problems.json", ROWS)), "train") == ROWS


def test_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "problems.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    assert read_rows(str(path), "train") == ROWS


def test_csv_rows_are_text_cells(tmp_path):
    path = tmp_path / "problems.csv"
    path.write_text('prompt,answer,level\n1+2=,3,1\n"say ""hi"", then 2+2=",4,2\n')
    assert read_rows(str(path), "train") == [
        {"prompt": "1+2=", "answer": "3", "level": "1"},
        {"prompt": 'say "hi", then 2+2=', "answer": "4", "level": "2"},
    ]


def test_a_datasets_folder(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert read_rows(str(tmp_path / "saved"), "train") == ROWS


def test_a_datasets_folder_of_splits_gives_the_split_asked_for(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:2]), "test": datasets.Dataset.from_list(ROWS[2:])}).save_to_disk(
        str(tmp_path / "saved")
    )
    assert read_rows(str(tmp_path / "saved"), "train") == ROWS[:2]
    assert read_rows(str(tmp_path / "saved"), "test") == ROWS[2:]
    refused(str(tmp_path / "saved"), "no split 'validation'", "train, test", "dataset.split", split="validation")


# --- what cannot be read ----------------------------------------------------------------------


def test_an_unparseable_jsonl_line_is_named_by_its_number(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + '{"prompt": "2+2=", "answer": \n' + json.dumps(ROWS[2]) + "\n")
    refused(str(path), f"{path}, line 3: not JSON", "Each line must be one JSON object")


def test_a_jsonl_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(["1+2=", "3"]) + "\n")
    refused(str(path), f"{path}, line 2: a JSON list, not an object of columns")


@pytest.mark.parametrize("name, content", [("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("header-only.csv", "prompt,answer\n")])
def test_a_file_without_rows(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    refused(str(path), f"{path}: it holds no rows")


def test_an_empty_parquet_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    refused(str(path), f"{path}: it holds no rows")


@pytest.mark.parametrize("name", ["problems.txt", "problems.tsv", "problems"])
def test_an_unknown_suffix(tmp_path, name):
    path = tmp_path / name
    path.write_text("1+2=\t3\n")
    message = refused(str(path), f"{path}: rlrun reads .jsonl, .parquet and .csv")
    assert (Path(name).suffix or "a file without a suffix") in message


@pytest.mark.parametrize("name", ["missing.jsonl", "missing.parquet", "missing-folder"])
def test_a_missing_file(tmp_path, name):
    refused(str(tmp_path / name), f"{tmp_path / name}: no such file or folder", str(Path.cwd()))


def test_a_relative_missing_path_is_not_taken_for_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused("data/problems.jsonl", "data/problems.jsonl: no such file or folder", str(tmp_path))


def test_a_csv_row_with_more_cells_than_columns(tmp_path):
    path = tmp_path / "problems.csv"
    path.write_text("prompt,answer\n1+2=,3\n2+2=,4,extra\n")
    refused(str(path), f"{path}, line 3: 3 cells for 2 columns")


def test_a_damaged_parquet_file(tmp_path):
    path = tmp_path / "problems.parquet"
    path.write_bytes(b"PAR1 this is not parquet at all")
    refused(str(path), f"{path}: not a readable Parquet file")


def test_a_folder_that_datasets_did_not_save(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("hello")
    refused(str(tmp_path / "folder"), f"{tmp_path / 'folder'}: not a folder saved by `datasets`")


@pytest.mark.parametrize("name", ["problems.jsonl", "problems.csv"])
def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path, name):
    path = tmp_path / name
    good = b'{"prompt": "1+2=", "answer": "3"}\n' if name.endswith("jsonl") else b"prompt,answer\n"
    bad = '{"prompt": "café 2+2=", "answer": "4"}\n' if name.endswith("jsonl") else "café 2+2=,4\n"
    path.write_bytes(good + bad.encode("latin-1"))
    refused(str(path), f"{path}, line 2: not UTF-8 text", "Save the file as UTF-8")


def test_a_spreadsheets_byte_order_mark_and_windows_line_ends(tmp_path):
    csv_path = tmp_path / "problems.csv"
    csv_path.write_bytes("prompt,answer\r\n1+2=,3\r\n".encode("utf-8-sig"))
    assert read_rows(str(csv_path), "train") == [{"prompt": "1+2=", "answer": "3"}]
    jsonl_path = tmp_path / "problems.jsonl"
    jsonl_path.write_bytes("".join(json.dumps(r) + "\r\n" for r in ROWS).encode("utf-8-sig"))
    assert read_rows(str(jsonl_path), "train") == ROWS


def test_a_line_separator_inside_a_json_string_is_not_a_line_end(tmp_path):
    path = tmp_path / "problems.jsonl"
    row = {"prompt": "first\u2028second", "answer": "3"}
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_rows(str(path), "train") == [row]
