"""Tools over local data: SQL on a read-only SQLite database, and full-text search over a local corpus.

`run_sql(db, query)` opens the database read-only (`mode=ro` and `PRAGMA query_only`), so a model's
`DROP TABLE` fails instead of costing the data; a progress handler stops a query past its time budget; at most
`max_rows` rows come back, as a text table. `SearchIndex` is SQLite's FTS5 full-text index ranked by BM25 (the
standard lexical ranking, built into the sqlite3 module of every Python: no service to run): `build(path,
docs)` writes it once, `search(query, k)` returns the best k passages with their titles.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from ascent.envs.tools.python import ToolResult


def run_sql(db: str | Path, query: str, *, timeout_s: float = 5.0, max_rows: int = 50) -> ToolResult:
    """One read-only query -> its rows as text (header, then one line per row), or the error."""
    if not Path(db).is_file():
        return ToolResult(False, "", f"database {str(db)!r} not found")
    conn = sqlite3.connect(f"file:{Path(db).resolve()}?mode=ro", uri=True, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)  # nonzero: interrupt
    try:
        conn.execute("PRAGMA query_only = ON")
        cur = conn.execute(query)
        rows = cur.fetchmany(max_rows + 1)
        header = [d[0] for d in cur.description or []]
    except sqlite3.Error as e:
        error = "query took too long (interrupted)" if "interrupted" in str(e) else f"{type(e).__name__}: {e}"
        return ToolResult(False, "", error)
    finally:
        conn.close()
    lines = [" | ".join(header)] + [" | ".join(str(v) for v in row) for row in rows[:max_rows]]
    if len(rows) > max_rows:
        lines.append(f"... (more than {max_rows} rows; add LIMIT or narrow the query)")
    return ToolResult(True, "\n".join(lines) + "\n")


class SearchIndex:
    """A BM25 full-text index of (title, text) passages in one SQLite file (FTS5)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def build(cls, path: str | Path, docs: Iterable[tuple[str, str]]) -> SearchIndex:
        """Write the index of `docs` (title, text) to `path` (replacing one that is there)."""
        Path(path).unlink(missing_ok=True)
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE VIRTUAL TABLE docs USING fts5(title, text)")
            conn.executemany("INSERT INTO docs VALUES (?, ?)", docs)
        return cls(path)

    def search(self, query: str, k: int = 3, max_chars: int = 300) -> ToolResult:
        """The `k` best passages for `query` (its words OR-ed), best first, each cut to `max_chars`."""
        words = [w for w in "".join(c if c.isalnum() else " " for c in query).split() if w]
        if not words:
            return ToolResult(False, "", "empty query: give some words to search for")
        match = " OR ".join(f'"{w}"' for w in words)
        with sqlite3.connect(f"file:{self.path.resolve()}?mode=ro", uri=True) as conn:
            hits = conn.execute(
                "SELECT title, text FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?", (match, k)
            ).fetchall()
        if not hits:
            return ToolResult(True, "no results\n")
        return ToolResult(True, "".join(f"[{t}] {x[:max_chars]}\n" for t, x in hits))
