"""Reading a run's experience store (`<run_dir>/experience.db`) for the episode browser, with sqlite3.

The studio imports only `tracking` and `config` (design.md), so it reads the store's documented file format
(schema version 1: see `ascent.transport.store`, which writes and documents it) rather than importing the
transport package. The connection is read-only (`mode=ro`): the file is in WAL mode, so it is read while the
run writes. Lists come newest first, a page at a time (`offset`, `limit`), filtered by iteration, reward
range, environment, status (incl. "dropped": anything not trained on) and a text search in prompt and
response.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ascent.errors import AscentError

FILE_NAME = "experience.db"
FORMAT = "ascent-experience"
SCHEMA_VERSION = 1
STATUSES = ("trained", "filtered", "dropped_stale", "surplus", "served")  # as ascent.transport.store
DROPPED = "dropped"
LIST_COLUMNS = (
    "id",
    "iteration",
    "group_index",
    "row_id",
    "env",
    "status",
    "drop_reason",
    "reward",
    "advantage",
    "turns",
    "finish_reason",
    "response_len",
    "staleness",
    "prompt_text",
    "response_text",
)
BLOBS = {
    "prompt_ids": "i",
    "response_ids": "i",
    "loss_mask": "B",
    "sampler_logprobs": "d",
    "token_versions": "i",
}
JSONS = ("reward_components", "turn_rewards", "segments", "metadata")


class StoreError(AscentError):
    """A missing, foreign or incompatible experience store, or a filter it cannot answer."""


@contextmanager
def open_db(run_dir: Path) -> Iterator[tuple[sqlite3.Connection, dict[str, str]]]:
    """(read-only connection, meta table) of the run's store; StoreError names the path when there is none
    or it is not an ascent experience store of the schema version this studio reads."""
    path = run_dir / FILE_NAME
    if not path.is_file():
        raise StoreError(f"{path}: no experience store here.")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
    try:
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as err:
            raise StoreError(f"{path} is not an ascent experience store ({err}).") from None
        if meta.get("format") != FORMAT or int(meta.get("schema_version", 0)) != SCHEMA_VERSION:
            raise StoreError(
                f"{path}: format {meta.get('format')!r} schema {meta.get('schema_version')!r}; this studio "
                f"reads {FORMAT} schema {SCHEMA_VERSION}: open it with the ascent that wrote it."
            )
        yield conn, meta
    finally:
        conn.close()


def where(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    """The SQL WHERE clause (or "") and its parameters for the filters given (None or absent: any).
    `search` matches text in the prompt or the response, case-insensitively (ASCII)."""
    terms: list[tuple[str, list[Any]]] = []
    for column, op, key in (
        ("iteration", "=", "iteration"),
        ("reward", ">=", "min_reward"),
        ("reward", "<=", "max_reward"),
        ("env", "=", "env"),
    ):
        if filters.get(key) is not None:
            terms.append((f"{column} {op} ?", [filters[key]]))
    status = filters.get("status")
    if status == DROPPED:
        terms.append(("status != ?", ["trained"]))
    elif status is not None:
        if status not in STATUSES:
            raise StoreError(f"status {status!r}: unknown; use one of {', '.join(STATUSES)}, {DROPPED}.")
        terms.append(("status = ?", [status]))
    if filters.get("search"):
        pattern = "%" + _escape_like(str(filters["search"])) + "%"
        clause = "(prompt_text LIKE ? ESCAPE '\\' OR response_text LIKE ? ESCAPE '\\')"
        terms.append((clause, [pattern, pattern]))
    if not terms:
        return "", []
    return " WHERE " + " AND ".join(t for t, _ in terms), [p for _, ps in terms for p in ps]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def count(conn: sqlite3.Connection, filters: dict[str, Any]) -> int:
    clause, params = where(filters)
    return int(conn.execute(f"SELECT COUNT(*) FROM episodes{clause}", params).fetchone()[0])


def page(conn: sqlite3.Connection, filters: dict[str, Any], offset: int, limit: int) -> list[dict[str, Any]]:
    """The matching episodes' LIST_COLUMNS, newest (highest id) first, `limit` of them after `offset`."""
    clause, params = where(filters)
    sql = f"SELECT {', '.join(LIST_COLUMNS)} FROM episodes{clause} ORDER BY id DESC LIMIT ? OFFSET ?"
    rows = conn.execute(sql, [*params, limit, offset]).fetchall()
    return [dict(zip(LIST_COLUMNS, row, strict=True)) for row in rows]


def distinct(conn: sqlite3.Connection, column: str) -> list[Any]:
    """The distinct values of `column` (iteration, env or status), sorted, for the filter menus."""
    if column not in ("iteration", "env", "status"):
        raise StoreError(f"distinct {column!r}: only iteration, env and status are offered.")
    return [v for (v,) in conn.execute(f"SELECT DISTINCT {column} FROM episodes ORDER BY {column}")]


def episode(conn: sqlite3.Connection, episode_id: int) -> dict[str, Any]:
    """Every column of one episode, token blobs unpacked and JSON columns parsed; StoreError when absent."""
    cursor = conn.execute("SELECT * FROM episodes WHERE id = ?", (episode_id,))
    found = cursor.fetchone()
    if found is None:
        low, high = conn.execute("SELECT MIN(id), MAX(id) FROM episodes").fetchone()
        have = f"ids {low}..{high}" if low is not None else "no episodes yet"
        raise StoreError(f"no episode with id {episode_id} ({have}).")
    out = dict(zip([d[0] for d in cursor.description], found, strict=True))
    for name, code in BLOBS.items():
        out[name] = unpack(out[name], code)
    for name in JSONS:
        out[name] = json.loads(out[name])
    return out


def unpack(blob: bytes, code: str) -> list[Any]:
    """Little-endian packed values of array type `code` ("i" int32, "B" uint8, "d" float64) -> a list."""
    values = array(code)
    values.frombytes(blob)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def labelled_segments(ep: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The response's segments named: `model turn k` (mask 1, with its reward), `observation` (mask 0 between
    turns), or one `response, not trained on` when no token has loss mask 1 (masked out, e.g. truncated)."""
    if not any(ep["loss_mask"]):
        return [("response, not trained on", seg) for seg in ep["segments"]]
    out, turn, rewards = [], 0, ep["turn_rewards"]
    for seg in ep["segments"]:
        if seg["mask"]:
            reward = f", reward {rewards[turn]:.3g}" if turn < len(rewards) else ""
            out.append((f"model turn {turn + 1}{reward}", seg))
            turn += 1
        else:
            out.append(("observation", seg))
    return out
