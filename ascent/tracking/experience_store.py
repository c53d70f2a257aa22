"""The experience store: every episode of an RL run in one SQLite file, `<run_dir>/experience.db`; its file
format, and the API that reads it.

The loop's writer (`ascent.transport.store_writer`) records each episode with what became of it: trained on,
`filtered` (DAPO dynamic sampling: no reward signal; `algorithm.filter_zero_advantage`), `dropped_stale`
(over `rollout.max_staleness`) or `surplus` (sampled after the iteration's batch was full); `ascent serve
--record` writes each sample it returned as a one-turn episode with status `served`. The file is in
WAL mode, so `open_store` (the `ascent episodes` command, the studio, a notebook) reads it while a run writes.
It sits in `tracking`, below the writer and below the studio, so both read one copy of the format: a run's
record, like metrics.jsonl and status.json.

Schema version 1 (`meta` holds `format=ascent-experience` and `schema_version`, plus `tokenizer`, the
directory whose tokenizer decodes the ids). One `episodes` row per episode; token data are little-endian
packed blobs: `prompt_ids`, `response_ids`, `token_versions` int32, `loss_mask` uint8, `sampler_logprobs`
float64 (one entry per response token). `segments` is JSON: the response as runs of equal loss mask,
`[{"mask", "start", "end", "text"}]` (mask 1: a model turn; 0: an observation, or a masked-out response).
`prompt_text` and segment texts keep special tokens; `response_text` is the episode's own (as rewarded).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ascent.errors import AscentError
from ascent.messages import Episode, ImageInput
from ascent.tracking.experience_images import read_images

FILE_NAME = "experience.db"
FORMAT = "ascent-experience"
SCHEMA_VERSION = 1
STATUSES = ("trained", "filtered", "dropped_stale", "surplus", "served")
DROPPED = "dropped"  # a status filter: every episode that was not trained on

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    id INTEGER PRIMARY KEY,          -- 1, 2, ... in the order the loop recorded them
    iteration INTEGER NOT NULL,      -- the iteration that sampled (and trained on, or dropped) it
    group_index INTEGER,             -- its group's place in the iteration's update; NULL if dropped
    row_id INTEGER NOT NULL,         -- the dataset row (task) it answered
    env TEXT,                        -- environment name (env source runs); NULL for single-turn rewards
    status TEXT NOT NULL,            -- one of STATUSES
    drop_reason TEXT,                -- why it was not trained on; NULL when trained
    reward REAL NOT NULL,
    reward_components TEXT NOT NULL, -- JSON object
    advantage REAL,                  -- mean advantage over loss-mask tokens; NULL when dropped before
    turns INTEGER NOT NULL,          -- model turns
    turn_rewards TEXT NOT NULL,      -- JSON list, one per model turn (multi-turn)
    finish_reason TEXT NOT NULL,     -- stop | length | abort
    policy_version INTEGER NOT NULL, -- the oldest token's policy version
    trainer_version INTEGER NOT NULL,
    staleness INTEGER NOT NULL,      -- trainer_version - policy_version
    prompt_len INTEGER NOT NULL,
    response_len INTEGER NOT NULL,
    prompt_text TEXT NOT NULL,
    response_text TEXT NOT NULL,
    segments TEXT NOT NULL,          -- JSON list of {mask, start, end, text}
    prompt_ids BLOB NOT NULL,        -- int32 LE
    response_ids BLOB NOT NULL,      -- int32 LE
    loss_mask BLOB NOT NULL,         -- uint8
    sampler_logprobs BLOB NOT NULL,  -- float64 LE
    token_versions BLOB NOT NULL,    -- int32 LE
    metadata TEXT NOT NULL,          -- JSON: the row's fields and the episode's (turns, env_error, ...)
    created REAL NOT NULL            -- unix time it was written
);
CREATE INDEX IF NOT EXISTS episodes_iteration ON episodes (iteration);
CREATE INDEX IF NOT EXISTS episodes_status ON episodes (status);
"""


class StoreError(AscentError):
    """A missing, foreign or incompatible experience store, or a query it cannot answer."""


# ---------------------------------------------------------------- packed token data


def pack(values: Sequence[int] | Sequence[float], code: str) -> bytes:
    """A list -> little-endian bytes of array type `code` ("i" int32, "B" uint8, "d" float64)."""
    out = array(code, values)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def unpack(blob: bytes, code: str) -> list[Any]:
    out = array(code)
    out.frombytes(blob)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tolist()


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class EpisodeRecord:
    """One stored episode (the columns of `episodes`, token data unpacked, JSON parsed)."""

    id: int
    iteration: int
    group_index: int | None
    row_id: int
    env: str | None
    status: str
    drop_reason: str | None
    reward: float
    reward_components: dict[str, float]
    advantage: float | None
    turns: int
    turn_rewards: list[float]
    finish_reason: str
    policy_version: int
    trainer_version: int
    staleness: int
    prompt_len: int
    response_len: int
    prompt_text: str
    response_text: str
    segments: list[dict[str, Any]]
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    token_versions: list[int]
    metadata: dict[str, Any]
    created: float

    def to_episode(self, images: tuple[ImageInput, ...] = ()) -> Episode:
        """The episode as the loop had it (to replay it, or score it again); `images`: its stored images
        (`ExperienceStore.images`)."""
        return Episode(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            sampler_logprobs=self.sampler_logprobs,
            loss_mask=self.loss_mask,
            finish_reason=self.finish_reason,  # type: ignore[arg-type]
            row_id=self.row_id,
            policy_version=self.policy_version,
            token_versions=self.token_versions,
            reward=self.reward,
            reward_components=self.reward_components,
            response_text=self.response_text,
            metadata=self.metadata,
            images=images,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def labelled_segments(r: EpisodeRecord) -> list[tuple[str, dict[str, Any]]]:
    """The response's segments named: `model turn k` (mask 1, with its reward), `observation` (mask 0 between
    turns), or one `response, not trained on` when no token has loss mask 1 (masked out, e.g. truncated)."""
    if not any(r.loss_mask):
        return [("response, not trained on", seg) for seg in r.segments]
    out, turn = [], 0
    for seg in r.segments:
        if seg["mask"]:
            reward = f", reward {r.turn_rewards[turn]:.3g}" if turn < len(r.turn_rewards) else ""
            out.append((f"model turn {turn + 1}{reward}", seg))
            turn += 1
        else:
            out.append(("observation", seg))
    return out


BLOBS = {
    "prompt_ids": "i",
    "response_ids": "i",
    "loss_mask": "B",
    "sampler_logprobs": "d",
    "token_versions": "i",
}
JSONS = ("reward_components", "turn_rewards", "segments", "metadata")
COLUMNS = tuple(EpisodeRecord.__dataclass_fields__)
SUMMARY_COLUMNS = (  # what a list shows of each episode (ExperienceStore.summaries): no token data
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


def _record(row: sqlite3.Row) -> EpisodeRecord:
    values = dict(zip(COLUMNS, row, strict=True))
    for name, code in BLOBS.items():
        values[name] = unpack(values[name], code)
    for name in JSONS:
        values[name] = json.loads(values[name])
    return EpisodeRecord(**values)


# ---------------------------------------------------------------- reading


def store_path(run_dir: str | Path) -> Path:
    """`<run_dir>/experience.db`, or `run_dir` itself when it names a file."""
    p = Path(run_dir)
    return p if p.suffix == ".db" or p.is_file() else p / FILE_NAME


def check_schema(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    """The `meta` table of an ascent experience store of this schema version; StoreError otherwise."""
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as err:  # not a database, or no meta table
        raise StoreError(f"{path} is not an ascent experience store ({err}).") from None
    if meta.get("format") != FORMAT:
        raise StoreError(f"{path} is not an ascent experience store (meta format={meta.get('format')!r}).")
    version = int(meta.get("schema_version", 0))
    if version != SCHEMA_VERSION:
        newer = "a newer ascent: upgrade ascent" if version > SCHEMA_VERSION else "an older ascent"
        raise StoreError(
            f"{path} has experience-store schema version {version}; this ascent reads version "
            f"{SCHEMA_VERSION}. It was written by {newer} to read it."
        )
    return meta


def open_store(run_dir: str | Path) -> ExperienceStore:
    """Open a run's experience store read-only (while the run writes it, too). StoreError names the path
    when there is none, or it is not one this ascent reads."""
    path = store_path(run_dir)
    if not path.is_file():
        raise StoreError(
            f"{path}: no experience store here. It is written by `ascent train` when "
            "tracking.experience_store=true (the default); check the run directory."
        )
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
    try:
        meta = check_schema(conn, path)
    except StoreError:
        conn.close()
        raise
    return ExperienceStore(conn, path, meta)


@dataclass(frozen=True)
class Query:
    """Filters of `ExperienceStore.episodes`; None means any."""

    iteration: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    env: str | None = None
    status: str | None = None  # one of STATUSES, or "dropped": any but trained
    search: str | None = None  # text in the prompt or the response, case-insensitive (ASCII)

    def where(self) -> tuple[str, list[Any]]:
        """The SQL WHERE clause (or "") and its parameters."""
        terms: list[tuple[str, list[Any]]] = []
        for column, op, value in (
            ("iteration", "=", self.iteration),
            ("reward", ">=", self.min_reward),
            ("reward", "<=", self.max_reward),
            ("env", "=", self.env),
        ):
            if value is not None:
                terms.append((f"{column} {op} ?", [value]))
        if self.status == DROPPED:
            terms.append(("status != ?", ["trained"]))
        elif self.status is not None:
            if self.status not in STATUSES:
                raise StoreError(
                    f"status {self.status!r}: unknown; use one of {', '.join(STATUSES)}, {DROPPED}."
                )
            terms.append(("status = ?", [self.status]))
        if self.search:
            pattern = "%" + _escape_like(self.search) + "%"
            clause = "(prompt_text LIKE ? ESCAPE '\\' OR response_text LIKE ? ESCAPE '\\')"
            terms.append((clause, [pattern, pattern]))
        clause = " AND ".join(t for t, _ in terms)
        return (f" WHERE {clause}" if clause else ""), [v for _, vs in terms for v in vs]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class ExperienceStore:
    """A read-only view of one run's `experience.db`; `close()` it (or use `with`)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, meta: dict[str, str]) -> None:
        self.conn, self.path, self.meta = conn, path, meta

    def __enter__(self) -> ExperienceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def count(self, **filters: Any) -> int:
        where, params = Query(**filters).where()
        return int(self.conn.execute(f"SELECT COUNT(*) FROM episodes{where}", params).fetchone()[0])

    def iter_episodes(self, limit: int | None = None, **filters: Any) -> Iterator[EpisodeRecord]:
        """Episodes in recording order, filtered by `Query`'s fields (iteration, min_reward, max_reward, env,
        status), at most `limit`."""
        where, params = Query(**filters).where()
        sql = f"SELECT {', '.join(COLUMNS)} FROM episodes{where} ORDER BY id"
        if limit is not None:
            sql, params = sql + " LIMIT ?", [*params, limit]
        for row in self.conn.execute(sql, params):
            yield _record(row)

    def episodes(self, limit: int | None = None, **filters: Any) -> list[EpisodeRecord]:
        """`iter_episodes` as a list."""
        return list(self.iter_episodes(limit, **filters))

    def summaries(self, offset: int, limit: int, **filters: Any) -> list[dict[str, Any]]:
        """The matching episodes' SUMMARY_COLUMNS (no token data), newest (highest id) first, `limit` of them
        after `offset`: one page of a list, however many episodes the run has."""
        where, params = Query(**filters).where()
        sql = f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM episodes{where} ORDER BY id DESC LIMIT ? OFFSET ?"
        rows = self.conn.execute(sql, [*params, limit, offset]).fetchall()
        return [dict(zip(SUMMARY_COLUMNS, row, strict=True)) for row in rows]

    def episode(self, episode_id: int) -> EpisodeRecord:
        """The episode with this id; StoreError when there is none."""
        row = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM episodes WHERE id = ?", (episode_id,))
        found = row.fetchone()
        if found is None:
            low, high = self.conn.execute("SELECT MIN(id), MAX(id) FROM episodes").fetchone()
            have = f"ids {low}..{high}" if low is not None else "no episodes yet"
            raise StoreError(f"{self.path}: no episode with id {episode_id} ({have}).")
        return _record(found)

    def images(self, episode_id: int) -> tuple[ImageInput, ...]:
        """Episode `episode_id`'s images, in order, patches and all (`ascent.tracking.experience_images`)."""
        return read_images(self.conn, episode_id)

    def distinct(self, column: str) -> list[Any]:
        """The distinct values of `column` (iteration, env or status), sorted; for filter menus."""
        if column not in ("iteration", "env", "status"):
            raise StoreError(f"distinct {column!r}: only iteration, env and status are offered.")
        rows = self.conn.execute(f"SELECT DISTINCT {column} FROM episodes ORDER BY {column}").fetchall()
        return [value for (value,) in rows]

    def pass_rates(self, success: float) -> dict[int, float]:
        """Each dataset row's share of trained episodes with reward >= `success`, by row id (rows with no
        trained episode are absent)."""
        sql = "SELECT row_id, AVG(reward >= ?) FROM episodes WHERE status = 'trained' GROUP BY row_id"
        return {int(row): float(rate) for row, rate in self.conn.execute(sql, (success,))}

    def to_sft_rows(self, min_reward: float | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """Rows `ascent sft` reads (`prompt`, `prompt_ids`, `response`): the best episode of every dataset
        row, among single-turn episodes that ended on a stop token with reward >= `min_reward`. Multi-turn
        episodes are left out: a prompt/response pair cannot keep their observations out of the loss."""
        best: dict[int, EpisodeRecord] = {}
        for r in self.iter_episodes(min_reward=min_reward, status=status):
            if r.turns > 1 or r.finish_reason != "stop" or not r.response_text:
                continue
            if r.row_id not in best or r.reward >= best[r.row_id].reward:  # ties: the newer policy's
                best[r.row_id] = r
        return [_sft_row(r) for _, r in sorted(best.items())]


def _sft_row(r: EpisodeRecord) -> dict[str, Any]:
    return {
        "prompt": r.prompt_text or " ",
        "prompt_ids": r.prompt_ids,
        "response": r.response_text,
        "reward": r.reward,
        "row_id": r.row_id,
        "episode_id": r.id,
    }


# ---------------------------------------------------------------- export


def export(records: Iterator[EpisodeRecord] | Sequence[EpisodeRecord], out: str | Path) -> int:
    """Write the records to `out`: `.jsonl` (one object per line) or `.parquet` (JSON-valued columns as JSON
    strings; needs pyarrow). Returns how many were written."""
    path = Path(out)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".parquet"):
        raise StoreError(
            f"--export {out}: unknown format {suffix or '(none)'}; name a .jsonl or .parquet file."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        n = 0
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r.to_dict()) + "\n")
                n += 1
        return n
    return _export_parquet(records, path)


def _export_parquet(records: Iterator[EpisodeRecord] | Sequence[EpisodeRecord], path: Path) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise StoreError(
            f"--export {path}: Parquet needs pyarrow; install it (pip install pyarrow) or export .jsonl."
        ) from None
    schema = _arrow_schema(pa)
    n, chunk = 0, []
    with pq.ParquetWriter(str(path), schema) as writer:
        for r in records:
            row = r.to_dict()
            chunk.append(row | {name: json.dumps(row[name]) for name in JSONS})
            if len(chunk) == 1024:
                writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
                n, chunk = n + len(chunk), []
        if chunk or not n:
            writer.write_table(pa.Table.from_pylist(chunk, schema=schema))
    return n + len(chunk)


def _arrow_schema(pa: Any) -> Any:
    kinds = {
        "id": pa.int64(),
        "iteration": pa.int64(),
        "group_index": pa.int64(),
        "row_id": pa.int64(),
        "reward": pa.float64(),
        "advantage": pa.float64(),
        "turns": pa.int64(),
        "policy_version": pa.int64(),
        "trainer_version": pa.int64(),
        "staleness": pa.int64(),
        "prompt_len": pa.int64(),
        "response_len": pa.int64(),
        "created": pa.float64(),
        "prompt_ids": pa.list_(pa.int32()),
        "response_ids": pa.list_(pa.int32()),
        "loss_mask": pa.list_(pa.int8()),
        "sampler_logprobs": pa.list_(pa.float64()),
        "token_versions": pa.list_(pa.int32()),
    }
    return pa.schema([(name, kinds.get(name, pa.string())) for name in COLUMNS])
