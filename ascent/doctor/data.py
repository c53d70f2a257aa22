"""Doctor checks of the datasets: `data.train_path` (and `data.val_path` when set) exist, and their first
`HEAD_ROWS` rows parse and hold the fields the run reads: a prompt (single-turn), and the reference answer
of a built-in reward that compares with one. An environment's or an agent's rows are checked by its own
reset(row) / run(client, row), which the doctor does not call: for them only parsing is checked.

Reads only the head of each file (a large dataset is not loaded), and never calls user code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ascent.config.schema import RunConfig
from ascent.data import DataError, load_rows
from ascent.data.fields import map_fields
from ascent.doctor.report import CheckResult, fail, ok

HEAD_ROWS = 50
# built-in rewards that read the reference answer from metadata[reward.kwargs.answer_key] ("answer")
ANSWER_REWARDS = ("exact_match", "numeric_match", "math_verify", "gsm8k")
EXTENSIONS = (".jsonl", ".json", ".parquet")


class HeadError(ValueError):
    """The head of a dataset file does not parse; the message names the line and the problem."""


def check_data(cfg: RunConfig) -> list[CheckResult]:
    """One check per dataset of the run (train, and val when set)."""
    out = [check_split(cfg, "train", cfg.data.train_path)]
    if cfg.data.val_path:
        out.append(check_split(cfg, "val", cfg.data.val_path))
    return out


def check_split(cfg: RunConfig, split: str, path: str) -> CheckResult:
    name, field = f"data: {split}", f"data.{split}_path"
    if not path:
        return fail(name, f"{field} is not set", f"set {field} to a .jsonl or .parquet file of prompts.")
    file = Path(path).expanduser()
    where = f"{field}={path!r}"
    if file.is_dir() and any((file / n).is_file() for n in ("dataset_info.json", "dataset_dict.json")):
        try:  # a saved `datasets` directory: read as the run reads it (its rows are memory-mapped)
            rows = load_rows(file, source=where, split=cfg.data.split)[:HEAD_ROWS]
        except DataError as err:
            return fail(name, str(err), "fix data.split or save the dataset again (`save_to_disk`).")
        return _rows_result(cfg, name, where, path, rows)
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        return fail(
            name,
            f"{where} {what} (looked at {file.resolve()})",
            f"point {field} at a .jsonl or .parquet file (a relative path is relative to the directory "
            "ascent runs in).",
        )
    if file.suffix.lower() not in EXTENSIONS:
        return fail(
            name,
            f"{where}: unknown file type {file.suffix or '(none)'!r}",
            f"use one of {', '.join(EXTENSIONS)}.",
        )
    try:
        rows = head_rows(file, HEAD_ROWS)
    except HeadError as err:
        return fail(name, f"{where} {err}", "fix the file: one JSON object per line (or a Parquet table).")
    return _rows_result(cfg, name, where, path, rows)


def _rows_result(cfg: RunConfig, name: str, where: str, path: str, rows: list[Any]) -> CheckResult:
    """The check's result for the head `rows` of the dataset at `path` (`where`: its field and value)."""
    if not rows:
        return fail(name, f"{where} has no rows", "point it at a file with at least one row.")
    d = cfg.data
    try:
        rows = (
            map_fields(rows, where, d.prompt_key, d.answer_key)
            if all(isinstance(r, dict) for r in rows)
            else rows
        )
    except DataError as err:
        return fail(name, str(err), "set data.prompt_key / data.answer_key to columns the rows have.")
    problems, needs = row_problems(cfg, rows)
    if problems:
        more = f" ({len(problems) - 1} more rows like it)" if len(problems) > 1 else ""
        fix = "add the field to every row (or point the config at the field the rows have)."
        return fail(name, f"{where} {problems[0]}{more}", fix)
    return ok(name, f"{path}: the first {len(rows)} rows parse; {needs}", rows_checked=len(rows))


def head_rows(file: Path, n: int) -> list[Any]:
    """The first `n` rows of a .jsonl / .json / .parquet file, without reading the rest."""
    if file.suffix.lower() == ".parquet":
        return _parquet_head(file, n)
    rows: list[Any] = []
    with file.open("rb") as f:
        first = f.read(64).lstrip()
        f.seek(0)
        if file.suffix.lower() == ".json" and first.startswith(b"["):
            return _json_array(f.read())[:n]
        for line_no, raw in enumerate(f, start=1):
            if len(rows) >= n:
                break
            if raw.strip():
                rows.append(_json_line(raw, line_no))
    return rows


def _json_line(raw: bytes, line_no: int) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise HeadError(f"line {line_no}: not UTF-8 ({err.reason})") from err
    except json.JSONDecodeError as err:
        raise HeadError(f"line {line_no}: not valid JSON ({err.msg} at column {err.colno})") from err


def _json_array(data: bytes) -> list[Any]:
    try:
        rows = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HeadError(f"is not valid JSON ({err})") from err
    return rows if isinstance(rows, list) else [rows]


def _parquet_head(file: Path, n: int) -> list[Any]:
    import pyarrow as pa  # deferred on purpose: only Parquet datasets need it
    import pyarrow.parquet as pq  # deferred: pyarrow, only for parquet

    try:
        batch = next(pq.ParquetFile(file).iter_batches(batch_size=n), None)
    except (pa.ArrowException, OSError) as err:
        raise HeadError(f"cannot be read as Parquet ({err})") from err
    return [] if batch is None else batch.to_pylist()


def row_problems(cfg: RunConfig, rows: list[Any]) -> tuple[list[str], str]:
    """(one problem per bad row, what was checked) for the fields the run reads from these rows; rows are
    numbered from 1, as the run's own data errors number them."""
    r = cfg.rollout
    problems = [
        f"row {i}: not a JSON object ({type(row).__name__})"
        for i, row in enumerate(rows, start=1)
        if not isinstance(row, dict)
    ]
    if problems:
        return problems, ""
    if r.multi_turn:
        return [], f"{r.source.label} reads the rows (their fields are not checked here)"
    answer_key = str(cfg.reward.kwargs.get("answer_key", "answer"))
    for i, row in enumerate(rows, start=1):
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) and prompt.strip()) and not (isinstance(prompt, list) and prompt):
            problems.append(
                f"row {i}: field 'prompt' is missing or empty (a string or a list of messages); the row has "
                f"fields {sorted(row)}"
            )
        fn = row.get("reward_fn") or cfg.reward.fn
        if fn in ANSWER_REWARDS and row.get(answer_key) is None:
            problems.append(
                f"row {i}: field {answer_key!r} is missing, and reward {fn} reads the reference answer from "
                f"it; the row has fields {sorted(row)} (reward.kwargs.answer_key names another field)"
            )
    reads = f"'prompt' and {answer_key!r}" if cfg.reward.fn in ANSWER_REWARDS else "'prompt'"
    return problems, f"each has {reads}"
