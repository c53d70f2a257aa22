"""load_rows: JSON lines, JSON arrays, Parquet, and the errors for bad files."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ascent.data import DataError, load_rows

ROWS = [
    {"prompt": "1+1=?", "answer": "2"},
    {"prompt": [{"role": "user", "content": "hi"}], "answer": "3", "data_source": "toy"},
]


def test_jsonl_round_trip_skips_blank_lines(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n")
    assert load_rows(path) == ROWS


def test_json_lines_and_json_array(tmp_path):
    lines = tmp_path / "lines.json"
    lines.write_text("\n".join(json.dumps(r) for r in ROWS))
    array = tmp_path / "array.json"
    array.write_text(json.dumps(ROWS, indent=2))
    assert load_rows(lines) == ROWS
    assert load_rows(array) == ROWS


def test_parquet_with_nested_messages(tmp_path):
    path = tmp_path / "train.parquet"
    rows = [{"prompt": [{"role": "user", "content": "a"}], "answer": "1"}] * 3
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert load_rows(str(path)) == rows


def test_missing_file_names_the_source(tmp_path):
    with pytest.raises(DataError, match=r"data.train_path=nope.jsonl: file not found"):
        load_rows(tmp_path / "nope.jsonl", source="data.train_path=nope.jsonl")


def test_bad_json_line_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c",,}\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 3: not valid JSON"):
        load_rows(path)


def test_non_object_line(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text('{"prompt": "a"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"line 2: expected a JSON object, got list"):
        load_rows(path)


def test_unknown_extension(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("prompt\na\n")
    with pytest.raises(DataError, match=r"unknown file extension '.csv'; use one of .jsonl, .json, .parquet"):
        load_rows(path)


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="cannot read as Parquet"):
        load_rows(path)


def test_relative_file_columns_are_relative_to_the_data_file(tmp_path, monkeypatch):
    """`db_path` / `index_path` (also in SkyRL's `extra_info`) name files beside the rows: a relative one
    comes back absolute under the data file's folder, whatever the working directory; others stay as
    stored."""
    data = tmp_path / "data"
    data.mkdir()
    data = data.resolve()
    rows = [
        {"prompt": "a", "db_path": "shop.db", "file": "x.txt"},
        {"prompt": "b", "extra_info": {"index_path": "sub/index.db"}},
        {"prompt": "c", "db_path": "/elsewhere/shop.db"},
    ]
    (data / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows[:1]), data / "rows.parquet")
    monkeypatch.chdir(tmp_path)
    got = load_rows("data/rows.jsonl")
    assert got[0] == {"prompt": "a", "db_path": str(data / "shop.db"), "file": "x.txt"}
    assert got[1]["extra_info"] == {"index_path": str(data / "sub" / "index.db")}
    assert got[2]["db_path"] == "/elsewhere/shop.db"
    assert load_rows("data/rows.parquet")[0]["db_path"] == str(data / "shop.db")
