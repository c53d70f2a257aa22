"""Read dataset rows from disk: JSON lines (.jsonl, .json), Parquet (.parquet) and a Hugging Face `datasets`
directory written by `save_to_disk` (a Dataset, or a DatasetDict with a split chosen by `split`).

The first step of the data path (design: "dataset rows -> prompts"). Rows come back as plain dicts, as stored
but for one thing: a relative path in a column that names a file (`FILE_COLUMNS`, also inside SkyRL's
`extra_info`) or an image (message content parts and the `images` column: `ascent.models.content`) is
relative to the data file's folder and comes back absolute, so a data folder with its database, index or
images beside the rows can move. `ascent.data.validation` checks the rows and
`ascent.data.prompts` renders them into token ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ascent.data.validation import DataError
from ascent.models.content import resolve_paths

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".parquet")
# columns that name a file the environment opens (the built-in tasks' `text_to_sql` and `search_qa`)
FILE_COLUMNS = ("db_path", "index_path")


def load_rows(
    path: str | Path, *, source: str | None = None, split: str | None = None
) -> list[dict[str, Any]]:
    """Read every row of a .jsonl / .json / .parquet file, or of a `save_to_disk` directory, as a dict.

    `.jsonl` is one JSON object per line (blank lines are skipped); `.json` may be JSON lines or one JSON
    array of objects. A directory is read with `datasets.load_from_disk`; `split` picks a DatasetDict's split
    (`data.split`). `source` names the file in errors (e.g. "data.train_path=x.jsonl"); defaults to the
    path.
    """
    file = Path(path)
    label = source or str(file)
    suffix = file.suffix.lower()
    if file.is_dir():
        rows = read_hf_dataset(file, label, split)
    elif suffix not in SUPPORTED_EXTENSIONS:
        raise DataError(
            f"{label}: unknown file extension {suffix or '(none)'!r}; "
            f"use one of {', '.join(SUPPORTED_EXTENSIONS)}."
        )
    elif not file.is_file():
        raise DataError(f"{label}: file not found ({file.resolve()}); check the path.")
    elif suffix == ".parquet":
        rows = _read_parquet(file, label)
    else:
        text = _read_utf8(file, label)
        is_array = suffix == ".json" and text.lstrip().startswith("[")
        rows = _read_json_array(text, label) if is_array else _read_json_lines(text, label)
    folder = file.resolve() if file.is_dir() else file.resolve().parent
    for row in rows:
        _resolve_files(row, folder)
        resolve_paths(row, folder)
        if isinstance(row.get("extra_info"), dict):
            _resolve_files(row["extra_info"], folder)
    return rows


def _resolve_files(row: dict[str, Any], folder: Path) -> None:
    """A relative path in a `FILE_COLUMNS` column of `row` -> the absolute path under `folder`, in place."""
    for key in FILE_COLUMNS:
        value = row.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            row[key] = str(folder / value)


def _read_utf8(file: Path, label: str) -> str:
    """The file's text; a byte that is not UTF-8 is reported with its line and column."""
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataError(
            f"{label} line {line}, column {column}: byte 0x{data[err.start]:02x} is not UTF-8 "
            f"({err.reason}); save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)."
        ) from err


def _read_json_lines(text: str, label: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(
                f"{label} line {line_no}: not valid JSON ({err.msg} at column {err.colno}); "
                "each line must hold one JSON object."
            ) from err
        if not isinstance(row, dict):
            raise DataError(
                f"{label} line {line_no}: expected a JSON object, got {type(row).__name__}; "
                'each line must hold one object like {"prompt": "..."}.'
            )
        rows.append(row)
    return rows


def _read_json_array(text: str, label: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{label} line {err.lineno}: not valid JSON ({err.msg} at column {err.colno}); "
            "a .json file must be JSON lines or one array of objects."
        ) from err
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataError(
                f"{label} row {index + 1}: expected a JSON object, got {type(row).__name__}; "
                "the array must hold objects."
            )
    return data


def _read_parquet(file: Path, label: str) -> list[dict[str, Any]]:
    # deferred: pyarrow, only for parquet
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as err:
        raise DataError(
            f"{label}: cannot read as Parquet ({err}); check that the file is a Parquet table."
        ) from err
    return table.to_pylist()


def read_hf_dataset(folder: Path, label: str, split: str | None) -> list[dict[str, Any]]:
    """The rows of the `save_to_disk` directory `folder`: a Dataset, or the `split` of a DatasetDict (which
    may be omitted when it holds one split). Raises DataError for a directory `datasets` cannot read, a
    missing split, or `datasets` not installed."""
    if not (folder / "dataset_info.json").is_file() and not (folder / "dataset_dict.json").is_file():
        raise DataError(
            f"{label}: {folder.resolve()} is a directory but not a saved `datasets` dataset (no "
            "dataset_info.json or dataset_dict.json); point it at a .jsonl / .parquet file or at the directory "
            "`Dataset.save_to_disk` wrote."
        )
    try:  # deferred: datasets is optional (pip install 'ascent[datasets]') and slow to import
        import datasets
    except ImportError as err:
        raise DataError(
            f"{label}: reading a saved `datasets` directory needs the datasets library; "
            "`pip install 'ascent[datasets]'`, or export the rows to .parquet."
        ) from err
    try:
        data = datasets.load_from_disk(str(folder))
    except (OSError, ValueError, FileNotFoundError) as err:
        raise DataError(f"{label}: `datasets` cannot read {folder.resolve()} ({err}).") from err
    if isinstance(data, datasets.DatasetDict):
        names = list(data)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in data:
            raise DataError(
                f"{label}: data.split={split!r} is not a split of this dataset (it has {', '.join(names)}); "
                "set data.split to one of them."
            )
        data = data[split]
    elif split is not None:
        raise DataError(
            f"{label}: data.split={split!r}, but the directory holds one Dataset without splits; remove "
            "data.split."
        )
    return [dict(row) for row in data]
