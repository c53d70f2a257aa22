"""Writing the experience store (`ascent.transport.store`) off the hot path: the loop hands frozen episodes
and what became of them to `ExperienceWriter.put`, which only queues them; a background thread decodes
their texts, packs their token data and writes them in one transaction per batch it drains.

The queue holds at most `max_queued_tokens` tokens of unwritten episodes, so memory stays bounded: when the
disk falls that far behind, `put` waits (and says so once in the log). A failing disk costs the store, never
the run: the error is logged once, later episodes are discarded, and `close()` reports it. `prepare_store`
creates the file (or opens one of this schema) and deletes the episodes of iterations after `keep_through`,
which a resumed run samples again, before the writer starts.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascent.messages import Episode
from ascent.transport.store import (
    BLOBS,
    FORMAT,
    SCHEMA,
    SCHEMA_VERSION,
    STATUSES,
    StoreError,
    check_schema,
    pack,
)

log = logging.getLogger("ascent")

Decode = Callable[[Sequence[int]], str]
_INSERT_COLUMNS = (
    "iteration", "group_index", "row_id", "env", "status", "drop_reason", "reward", "reward_components",
    "advantage", "turns", "turn_rewards", "finish_reason", "policy_version", "trainer_version", "staleness",
    "prompt_len", "response_len", "prompt_text", "response_text", "segments", *BLOBS, "metadata", "created",
)  # fmt: skip
_INSERT = (
    f"INSERT INTO episodes ({', '.join(_INSERT_COLUMNS)}) VALUES ({', '.join('?' * len(_INSERT_COLUMNS))})"
)


@dataclass(frozen=True)
class Entry:
    """One episode for the store and what became of it: `status` (one of STATUSES), `reason` (unless
    trained), its group's place in the update (trained), its mean advantage (once computed)."""

    episode: Episode
    iteration: int
    status: str
    trainer_version: int
    group_index: int | None = None
    reason: str | None = None
    env: str | None = None
    advantage: float | None = None


def connect(path: Path, timeout_s: float = 30.0) -> sqlite3.Connection:
    """A read-write connection in WAL mode (readers never block the writer, nor it them)."""
    conn = sqlite3.connect(str(path), timeout=timeout_s)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def prepare_store(path: Path, keep_through: int, meta: dict[str, str] | None = None) -> None:
    """Create the store at `path`, or open an existing one, keeping only iterations <= `keep_through`.

    A file that is not a store of this schema version is moved aside to `<name>.old` (with a warning): it
    cannot take this run's episodes, and the run does not stop for it."""
    if path.exists():
        probe = sqlite3.connect(str(path))
        try:
            check_schema(probe, path)
        except StoreError as err:
            probe.close()
            _move_aside(path, err)
        else:
            probe.close()
    conn = connect(path)
    try:
        with conn:
            conn.executescript(SCHEMA)
            fixed = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION)}
            conn.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", fixed.items())
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", (meta or {}).items())
            conn.execute("DELETE FROM episodes WHERE iteration > ?", (keep_through,))
    finally:
        conn.close()


def _move_aside(path: Path, err: StoreError) -> None:
    old = path.with_name(path.name + ".old")
    log.warning("%s; moved it to %s and starting a new experience store", err, old)
    path.replace(old)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.replace(old.with_name(old.name + suffix))


class ExperienceWriter:
    """Writes queued entries to a prepared store on its own thread (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        decode: Decode | None = None,
        max_queued_tokens: int = 16_000_000,
        close_timeout_s: float = 300.0,
    ) -> None:
        self.path, self.decode = path, decode
        self.max_queued_tokens, self.close_timeout_s = max_queued_tokens, close_timeout_s
        self.error: BaseException | None = None
        self.written = 0
        self.waited_s = 0.0  # seconds `put` waited for the writer to make room
        self._queue: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self._queued_tokens = 0
        self._room = threading.Condition()
        self._prompt_cache: tuple[tuple[int, ...], str] = ((), "")
        self._thread = threading.Thread(target=self._run, name="experience-store", daemon=True)
        self._thread.start()

    def put(self, entries: Iterable[Entry]) -> None:
        """Queue entries for writing; returns at once unless `max_queued_tokens` are still unwritten."""
        for entry in entries:
            if entry.status not in STATUSES:
                raise ValueError(f"experience store: status {entry.status!r} is not one of {STATUSES}")
            if self.error is not None:
                return
            self._wait_for_room(entry.episode.num_tokens)
            self._queue.put(entry)

    def _wait_for_room(self, tokens: int) -> None:
        with self._room:
            if self._full(tokens):
                if self.waited_s == 0.0:
                    log.warning("experience store: %s is %d tokens behind; the loop waits for it", self.path,
                                self._queued_tokens)  # fmt: skip
                t0 = time.perf_counter()
                while self._full(tokens) and self._thread.is_alive():
                    self._room.wait(timeout=1.0)
                self.waited_s += time.perf_counter() - t0
            self._queued_tokens += tokens

    def _full(self, tokens: int) -> bool:
        """No room for `tokens` more (one episode always fits into an empty queue, however long)."""
        return self._queued_tokens > 0 and self._queued_tokens + tokens > self.max_queued_tokens

    def close(self) -> None:
        """Write what is queued, then stop the thread (waiting at most `close_timeout_s`)."""
        self._queue.put(None)
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive():
            log.warning("experience store: %s still writing after %.0f s; %d queued tokens are not stored",
                        self.path, self.close_timeout_s, self._queued_tokens)  # fmt: skip
        elif self.error is not None:
            log.warning("experience store: %s holds only the first %d episodes (%s)", self.path, self.written,
                        self.error)  # fmt: skip

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        done = False
        while not done:
            batch = self._take()
            done = batch[-1] is None
            entries = [e for e in batch if e is not None]
            if self.error is None and entries:
                try:
                    conn = conn or connect(self.path)
                    self._write(conn, entries)
                except Exception as err:  # a full disk or a broken file costs the store, not the run
                    self.error = err
                    log.error("experience store: writing %s failed (%s); no further episodes are stored",
                              self.path, err)  # fmt: skip
            with self._room:
                self._queued_tokens -= sum(e.episode.num_tokens for e in entries)
                self._room.notify_all()
        if conn is not None:
            conn.close()

    def _write(self, conn: sqlite3.Connection, entries: list[Entry]) -> None:
        rows = [self._row(e) for e in entries]
        with conn:
            conn.executemany(_INSERT, rows)
        self.written += len(rows)

    def _take(self, most: int = 512) -> list[Entry | None]:
        """The next entries: waits for one, then takes what else is queued (up to `most`, or the end mark)."""
        batch = [self._queue.get()]
        while batch[-1] is not None and len(batch) < most:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _row(self, e: Entry) -> tuple[Any, ...]:
        ep = e.episode
        versions = list(ep.token_versions) or [ep.policy_version] * len(ep.response_ids)
        oldest = min(versions, default=ep.policy_version)
        meta = ep.metadata
        return (
            e.iteration, e.group_index, ep.row_id, e.env, e.status, e.reason, ep.reward,
            json.dumps(ep.reward_components), e.advantage, int(meta.get("turns", 1)),
            json.dumps(list(meta.get("turn_rewards", []))),
            ep.finish_reason, oldest, e.trainer_version, e.trainer_version - oldest, len(ep.prompt_ids),
            len(ep.response_ids), self._prompt_text(ep.prompt_ids), ep.response_text,
            json.dumps(self._segments(ep)), pack(ep.prompt_ids, "i"), pack(ep.response_ids, "i"),
            pack(ep.loss_mask, "B"), pack(ep.sampler_logprobs, "d"), pack(versions, "i"),
            json.dumps(meta, default=str), time.time(),
        )  # fmt: skip

    def _prompt_text(self, ids: Sequence[int]) -> str:
        """Decoded once per prompt (the episodes of a group arrive one after another)."""
        key = tuple(ids)
        if self._prompt_cache[0] != key:
            self._prompt_cache = (key, self.decode(ids) if self.decode else "")
        return self._prompt_cache[1]

    def _segments(self, ep: Episode) -> list[dict[str, Any]]:
        """The response as runs of equal loss mask, each with its text."""
        out: list[dict[str, Any]] = []
        start = 0
        for i in range(1, len(ep.loss_mask) + 1):
            if i == len(ep.loss_mask) or ep.loss_mask[i] != ep.loss_mask[start]:
                ids = ep.response_ids[start:i]
                text = self.decode(ids) if self.decode else ""
                out.append({"mask": ep.loss_mask[start], "start": start, "end": i, "text": text})
                start = i
        return out
