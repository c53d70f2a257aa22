"""Data processors: steps that run in order on the loaded training rows before they are rendered and the
prompt sampler draws from them (`data.processors`; `builders.processors_from_config` builds the steps).

A step is a function from rows to rows (`Step`): keep the rows a predicate accepts (`filter_rows`), rewrite
each row (`transform_rows`), keep the rows whose pass rate lies in [low, high] (`difficulty_rows`, rates from a
column or from an earlier run's experience store, `store_pass_rates`), or a user's function. `run_steps`
runs them, logs what each kept, and names the step in every error; a step that leaves no row is the "no
usable training prompts" error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ascent.data.validation import DataError
from ascent.errors import AscentError
from ascent.tracking.experience_store import StoreError, open_store

log = logging.getLogger("ascent")
Row = dict[str, Any]
Step = Callable[[list[Row]], list[Row]]


def filter_rows(rows: list[Row], keep: Callable[[Row], Any]) -> list[Row]:
    """The rows for which `keep(row)` is true."""
    return [row for row in rows if keep(row)]


def transform_rows(rows: list[Row], fn: Callable[[Row], Any]) -> list[Row]:
    """`fn(row)` for every row; each result must be a dict."""
    out = []
    for i, row in enumerate(rows):
        new = fn(row)
        if not isinstance(new, dict):
            raise TypeError(f"row {i + 1}: returned a {type(new).__name__}, not a dict (a row)")
        out.append(new)
    return out


def difficulty_rows(
    rows: list[Row], rate: Callable[[int, Row], float | None], low: float, high: float
) -> list[Row]:
    """The rows whose pass rate `rate(index, row)` lies in [low, high] (None: unknown, dropped)."""
    kept = []
    for i, row in enumerate(rows):
        r = rate(i, row)
        if r is not None and low <= r <= high:
            kept.append(row)
    return kept


def column_rate(column: str) -> Callable[[int, Row], float | None]:
    """A row's pass rate read from its `column` (a number in [0, 1])."""

    def rate(i: int, row: Row) -> float | None:
        if column not in row:
            raise KeyError(f"row {i + 1} has no column {column!r} (its columns: {', '.join(map(str, row))})")
        value = row[column]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"row {i + 1}: column {column!r} is {value!r}, not a number")
        return float(value)

    return rate


def store_pass_rates(store: str, success: float, field: str) -> Callable[[int, Row], float | None]:
    """Pass rates from an earlier run's experience store on the same data, looked up by row index (a row's
    id in that run); rows it never trained on are unknown. A missing store is a DataError naming `field`."""
    try:
        with open_store(store) as s:
            rates = s.pass_rates(success)
    except StoreError as err:
        raise DataError(f"{field}={store!r}: {err}") from err
    return lambda i, row: rates.get(i)


def run_steps(rows: list[Row], steps: Sequence[tuple[str, Step]], source: str) -> list[Row]:
    """`rows` through each (label, step) in order; the count each step kept is logged. A step that raises
    or returns something other than rows is a DataError naming it; one that keeps no row is the "no usable
    training prompts" error, naming it."""
    for label, step in steps:
        before = len(rows)
        try:
            out = step(rows)
        except AscentError:
            raise
        except Exception as err:  # a user's plug-in: its error names the step, the run stops cleanly (exit 2)
            raise DataError(
                f"{source}: {label} failed: {type(err).__name__}: {err}; fix the processor."
            ) from err
        if not isinstance(out, list) or not all(isinstance(r, dict) for r in out):
            raise DataError(f"{source}: {label} returned {type(out).__name__}, not a list of rows (dicts).")
        if not out:
            raise DataError(
                f"{source}: no usable training prompts: {label} kept none of {before} rows; widen or remove it."
            )
        log.info("%s: %s kept %d of %d rows", source, label, len(out), before)
        rows = out
    return rows
