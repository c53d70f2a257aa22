"""Writing the experience store (its format and reader: `ascent.tracking.experience_store`) off the hot
path: the loop hands frozen episodes and what became of them to `ExperienceWriter.put`, which only queues
them; a background thread decodes their texts, packs their token data and writes them in one transaction per
batch it drains.

The queue holds at most `max_queued_tokens` tokens of unwritten episodes, so memory stays bounded: when the
disk falls that far behind, `put` waits (and says so once in the log). A lock held on the file by another
connection (a reader's long transaction, a copy tool) does not end the store: each write waits up to
`lock_timeout_s` (SQLite's busy timeout, WAL mode), then the writer warns, naming the file and the other
processes that have it open, and retries with backoff until the lock goes; episodes queued meanwhile are
written then. While it waits, a full queue drops new episodes instead of stalling the loop (counted in
`dropped`, said once per lock). One bad row (a NaN reward, a value that does not serialize) costs that
episode only (counted in `bad_rows`, logged); the others of its batch are written. Any other failure (a
full disk, a broken file) costs the store, never the run: the error is logged once, later episodes are
discarded, and `close()` reports it. `prepare_store`
creates the file (or opens one of this schema) and deletes the episodes of iterations after `keep_through`,
which a resumed run samples again, before the writer starts.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascent.messages import Episode
from ascent.tracking.experience_images import IMAGES_SCHEMA, write_images
from ascent.tracking.experience_store import (
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
    "iteration",
    "group_index",
    "row_id",
    "env",
    "status",
    "drop_reason",
    "reward",
    "reward_components",
    "advantage",
    "turns",
    "turn_rewards",
    "finish_reason",
    "policy_version",
    "trainer_version",
    "staleness",
    "prompt_len",
    "response_len",
    "prompt_text",
    "response_text",
    "segments",
    *BLOBS,
    "metadata",
    "created",
)
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


RETRY_S = (0.1, 5.0)  # the backoff between write attempts while the file is locked: first, longest
_BAD_ROW = (
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    OverflowError,
    TypeError,
    ValueError,
)


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
            conn.executescript(SCHEMA + IMAGES_SCHEMA)
            fixed = {"format": FORMAT, "schema_version": str(SCHEMA_VERSION)}
            conn.executemany("INSERT OR IGNORE INTO meta VALUES (?, ?)", fixed.items())
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", (meta or {}).items())
            conn.execute("DELETE FROM episodes WHERE iteration > ?", (keep_through,))
            conn.execute("DELETE FROM episode_images WHERE episode_id NOT IN (SELECT id FROM episodes)")
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
        lock_timeout_s: float = 10.0,
    ) -> None:
        self.path, self.decode = path, decode
        self.max_queued_tokens, self.close_timeout_s = max_queued_tokens, close_timeout_s
        self.lock_timeout_s = lock_timeout_s
        self.error: BaseException | None = None
        self.written = 0
        self.bad_rows = 0  # episodes not stored because their row could not be written
        self.dropped = 0  # episodes not stored because the queue was full while the file was locked
        self.locked_since: float | None = None  # monotonic time the current lock was first met
        self._give_up_at: float | None = None  # set by close(): stop waiting for a lock past it
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
            if self._wait_for_room(entry.episode.num_tokens):
                self._queue.put(entry)

    def _wait_for_room(self, tokens: int) -> bool:
        """Whether `tokens` more fit: waits for room, unless the writer waits for a lock (then drops)."""
        with self._room:
            t0 = None
            while self._full(tokens) and self._thread.is_alive():
                if self.locked_since is not None:
                    if self.dropped == 0:
                        log.warning(
                            "experience store: %s is locked and %d tokens wait; new episodes are dropped "
                            "until it is free (counted)",
                            self.path,
                            self._queued_tokens,
                        )
                    self.dropped += 1
                    return False
                if t0 is None:
                    t0 = time.perf_counter()
                    if self.waited_s == 0.0:
                        log.warning(
                            "experience store: %s is %d tokens behind; the loop waits for it",
                            self.path,
                            self._queued_tokens,
                        )
                self._room.wait(timeout=0.5)
            if t0 is not None:
                self.waited_s += time.perf_counter() - t0
            self._queued_tokens += tokens
            return True

    def _full(self, tokens: int) -> bool:
        """No room for `tokens` more (one episode always fits into an empty queue, however long)."""
        return self._queued_tokens > 0 and self._queued_tokens + tokens > self.max_queued_tokens

    def close(self) -> None:
        """Write what is queued, then stop the thread (waiting at most `close_timeout_s`)."""
        self._give_up_at = time.monotonic() + self.close_timeout_s
        self._queue.put(None)
        self._thread.join(self.close_timeout_s + 1.0)
        if self._thread.is_alive():
            log.warning(
                "experience store: %s still writing after %.0f s; %d queued tokens are not stored",
                self.path,
                self.close_timeout_s,
                self._queued_tokens,
            )
        elif self.error is not None:
            log.warning(
                "experience store: %s holds only the first %d episodes (%s)",
                self.path,
                self.written,
                self.error,
            )
        if self.bad_rows or self.dropped:
            log.warning(
                "experience store: %s holds %d episodes; %d could not be written (bad rows, logged above) "
                "and %d were dropped while the file was locked",
                self.path,
                self.written,
                self.bad_rows,
                self.dropped,
            )

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        done = False
        while not done:
            batch = self._take()
            done = batch[-1] is None
            entries = [e for e in batch if e is not None]
            if self.error is None and entries:
                try:
                    conn = conn or connect(self.path, self.lock_timeout_s)
                    self._write_when_free(conn, entries)
                except Exception as err:  # a full disk or a broken file costs the store, not the run
                    self.error = err
                    log.error(
                        "experience store: writing %s failed (%s); no further episodes are stored",
                        self.path,
                        err,
                    )
            with self._room:
                self._queued_tokens -= sum(e.episode.num_tokens for e in entries)
                self._room.notify_all()
        if conn is not None:
            conn.close()

    def _write_when_free(self, conn: sqlite3.Connection, entries: list[Entry]) -> None:
        """Write `entries`, retrying with backoff while another connection holds the file locked."""
        rows = self._rows(entries)
        pause = RETRY_S[0]
        while True:
            try:
                self._write(conn, rows)
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) and "busy" not in str(err):
                    raise
                if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                    raise StoreError(f"{self.path} stayed locked until the run ended ({err})") from err
                if self.locked_since is None:
                    self.locked_since = time.monotonic()
                    log.warning(
                        "experience store: %s is locked (%s; %s); %d episodes wait, retrying until it is "
                        "free",
                        self.path,
                        err,
                        _holders(self.path),
                        len(rows),
                    )
                time.sleep(pause)
                pause = min(RETRY_S[1], pause * 2)
                continue
            if self.locked_since is not None:
                log.warning(
                    "experience store: %s is free again after %.0f s; writing resumes",
                    self.path,
                    time.monotonic() - self.locked_since,
                )
                self.locked_since = None
            return

    def _rows(self, entries: list[Entry]) -> list[tuple[Entry, tuple[Any, ...]]]:
        """Each entry with its row; an entry whose row cannot be made costs that episode only."""
        out = []
        for e in entries:
            try:
                out.append((e, self._row(e)))
            except OSError:  # the disk, not the row: costs the store (see _run)
                raise
            except Exception as err:  # noqa: BLE001 - metadata that does not serialize, a NaN reward, ...
                self._bad_row(e, err)
        return out

    def _write(self, conn: sqlite3.Connection, rows: list[tuple[Entry, tuple[Any, ...]]]) -> None:
        """One transaction; a row the database refuses costs that episode only (the statement is undone,
        the transaction goes on). A lock or a disk error undoes the whole transaction and raises."""
        bad: list[tuple[Entry, Exception]] = []
        with conn:
            for e, row in rows:
                try:
                    episode_id = conn.execute(_INSERT, row).lastrowid
                    if e.episode.images and episode_id is not None:
                        _write_images(conn, episode_id, e.episode.images)
                except _BAD_ROW as err:
                    bad.append((e, err))
        for e, why in bad:
            self._bad_row(e, why)
        self.written += len(rows) - len(bad)

    def _bad_row(self, e: Entry, err: Exception) -> None:
        self.bad_rows += 1
        log.warning(
            "experience store: episode of row %d (iteration %d) not stored: %s: %s",
            e.episode.row_id + 1,
            e.iteration,
            type(err).__name__,
            err,
        )

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
        if not isinstance(ep.reward, (int, float)) or not math.isfinite(ep.reward):
            raise ValueError(f"its reward is {ep.reward!r}, not a finite number")
        versions = list(ep.token_versions) or [ep.policy_version] * len(ep.response_ids)
        oldest = min(versions, default=ep.policy_version)
        meta = ep.metadata
        return (
            e.iteration,
            e.group_index,
            ep.row_id,
            e.env,
            e.status,
            e.reason,
            ep.reward,
            json.dumps(ep.reward_components),
            e.advantage,
            int(meta.get("turns", 1)),
            json.dumps(list(meta.get("turn_rewards", []))),
            ep.finish_reason,
            oldest,
            e.trainer_version,
            e.trainer_version - oldest,
            len(ep.prompt_ids),
            len(ep.response_ids),
            self._prompt_text(ep.prompt_ids),
            ep.response_text,
            json.dumps(self._segments(ep)),
            pack(ep.prompt_ids, "i"),
            pack(ep.response_ids, "i"),
            pack(ep.loss_mask, "B"),
            pack(ep.sampler_logprobs, "d"),
            pack(versions, "i"),
            json.dumps(meta, default=str),
            time.time(),
        )

    def _prompt_text(self, ids: Sequence[int]) -> str:
        """Decoded once per prompt (the episodes of a group arrive one after another)."""
        key = tuple(ids)
        if self._prompt_cache[0] != key:
            self._prompt_cache = (key, self.decode(ids) if self.decode else "")
        return self._prompt_cache[1]

    def _segments(self, ep: Episode) -> list[dict[str, Any]]:
        """The response as runs of equal loss mask, each with its text."""
        out: list[dict[str, Any]] = []
        for mask, start, end in mask_runs(ep.loss_mask):
            text = self.decode(ep.response_ids[start:end]) if self.decode else ""
            out.append({"mask": mask, "start": start, "end": end, "text": text})
        return out


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """[(value, start, end)] of the runs of equal values in `mask`. C-level passes (this runs on the writer's
    thread, which shares the GIL with the loop): a single-turn mask is one `count`, a multi-turn one a
    `groupby` whose runs are measured by `len(list(run))`, never a Python step per token."""
    if not mask:
        return []
    if mask.count(mask[0]) == len(mask):
        return [(mask[0], 0, len(mask))]
    out, start = [], 0
    for value, run in itertools.groupby(mask):
        end = start + len(list(run))
        out.append((value, start, end))
        start = end
    return out


def _write_images(conn: sqlite3.Connection, episode_id: int, images: Sequence[Any]) -> None:
    """The episode's images (`experience_images`); if they cannot be stored, the episode is not either."""
    try:
        write_images(conn, episode_id, images)
    except _BAD_ROW:
        conn.execute("DELETE FROM episode_images WHERE episode_id = ?", (episode_id,))
        conn.execute("DELETE FROM episodes WHERE id = ?", (episode_id,))
        raise


def _holders(path: Path) -> str:
    """Which other processes have `path` open (Linux: /proc/<pid>/fd), as far as this user can see."""
    target, found = os.path.realpath(path), []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    except OSError:
        return "which process holds it is unknown"
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append(f"pid {pid} ({command[:80]})")
        except OSError:
            continue
    if not found:
        return "no other process has it open: a connection in this process holds it"
    return f"open in {', '.join(found[:5])}"
