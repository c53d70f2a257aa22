"""The experience store: episodes written on the writer's thread read back token for token, the filters, the
schema check, a reader while the writer writes, the trim of a resumed run, SFT rows and exports."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ascent.messages import Episode
from ascent.tracking.experience_store import FILE_NAME, StoreError, export, open_store
from ascent.transport.store_writer import Entry, ExperienceWriter, mask_runs, prepare_store


def decode(ids) -> str:
    return "".join(chr(ord("a") + i % 26) for i in ids)


def single(row: int, reward: float, n: int = 3, finish: str = "stop", version: int = 0) -> Episode:
    ids = [row * 10 + k for k in range(n)]
    return Episode(
        prompt_ids=[1, 2, row],
        response_ids=ids,
        sampler_logprobs=[-0.1 * (k + 1) / 3 for k in range(n)],
        loss_mask=[1] * n,
        finish_reason=finish,
        row_id=row,
        policy_version=version,  # type: ignore[arg-type]
        token_versions=[version] * n,
        reward=reward,
        reward_components={"exact": reward},
        response_text=decode(ids),
        metadata={"answer": str(row)},
    )


def multi_turn() -> Episode:
    """Model turn (3 tokens), observation (2), model turn (2); versions differ between the turns."""
    return Episode(
        prompt_ids=[7, 8],
        response_ids=[30, 31, 32, 40, 41, 33, 34],
        sampler_logprobs=[-0.5, -1.25, -1e-9, 0.0, 0.0, -2.0, -0.75],
        loss_mask=[1, 1, 1, 0, 0, 1, 1],
        finish_reason="stop",
        row_id=5,
        policy_version=1,
        token_versions=[1, 1, 1, 1, 1, 2, 2],
        reward=1.5,
        response_text="whole",
        metadata={"env": "calc", "turns": 2, "turn_rewards": [0.5, 1.0], "question": "1+1"},
    )


def write(path: Path, entries: list[Entry], keep_through: int = 0) -> Path:
    prepare_store(path, keep_through, meta={"tokenizer": "/nowhere"})
    writer = ExperienceWriter(path, decode=decode)
    writer.put(entries)
    writer.close()
    assert writer.error is None
    return path


def mixed() -> list[Entry]:
    """Iteration 1: a trained group of two and a stale one; iteration 2: a trained multi-turn episode and a
    filtered group."""
    return [
        Entry(single(0, 1.0), 1, "trained", trainer_version=0, group_index=0, advantage=0.7),
        Entry(single(0, 0.0), 1, "trained", trainer_version=0, group_index=0, advantage=-0.7),
        Entry(single(1, 1.0, version=-1), 1, "dropped_stale", trainer_version=0, reason="old"),
        Entry(multi_turn(), 2, "trained", trainer_version=2, group_index=0, env="calc", advantage=0.1),
        Entry(single(2, 0.5), 2, "filtered", trainer_version=1, reason="dynamic_sampling: equal rewards"),
    ]


def test_round_trip_is_token_exact(tmp_path: Path) -> None:
    path = write(tmp_path / FILE_NAME, mixed())
    with open_store(tmp_path) as store:
        records = store.episodes()
        assert [r.id for r in records] == [1, 2, 3, 4, 5]
        for entry, r in zip(mixed(), records, strict=True):
            e = entry.episode
            assert r.to_episode() == e  # ids, mask, float64 logprobs, versions, rewards, text, metadata
            assert (r.iteration, r.status, r.group_index, r.drop_reason) == (
                entry.iteration,
                entry.status,
                entry.group_index,
                entry.reason,
            )
            assert r.prompt_text == decode(e.prompt_ids)
            assert r.prompt_len == len(e.prompt_ids) and r.response_len == len(e.response_ids)
        mt = store.episode(4)
    assert store.path == path
    assert (mt.env, mt.turns, mt.turn_rewards, mt.staleness, mt.advantage) == ("calc", 2, [0.5, 1.0], 1, 0.1)
    segments = [(s["mask"], s["start"], s["end"], s["text"]) for s in mt.segments]
    assert segments == [
        (1, 0, 3, decode([30, 31, 32])),
        (0, 3, 5, decode([40, 41])),
        (1, 5, 7, decode([33, 34])),
    ]


def test_filters(tmp_path: Path) -> None:
    write(tmp_path / FILE_NAME, mixed())
    with open_store(tmp_path) as store:
        ids = lambda **f: [r.id for r in store.iter_episodes(**f)]  # noqa: E731
        assert ids(iteration=2) == [4, 5]
        assert ids(min_reward=0.5) == [1, 3, 4, 5]
        assert ids(max_reward=0.5) == [2, 5]
        assert ids(min_reward=0.6, max_reward=1.2) == [1, 3]
        assert ids(env="calc") == [4]
        assert ids(status="trained") == [1, 2, 4]
        assert ids(status="dropped") == [3, 5]
        assert ids(status="dropped_stale", iteration=1) == [3]
        assert ids(limit=2, status="trained") == [1, 2]
        assert store.count(status="filtered") == 1
        with pytest.raises(StoreError, match="status 'stale': unknown"):
            store.episodes(status="stale")
        with pytest.raises(StoreError, match="no episode with id 9 .ids 1..5"):
            store.episode(9)


def test_a_missing_foreign_or_newer_store_is_refused_by_path(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"{tmp_path / FILE_NAME}: no experience store here"):
        open_store(tmp_path)
    (tmp_path / "junk.db").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(StoreError, match="junk.db is not an ascent experience store"):
        open_store(tmp_path / "junk.db")
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE t (x)")
    other.close()
    with pytest.raises(StoreError, match="other.db is not an ascent experience store"):
        open_store(tmp_path / "other.db")
    path = write(tmp_path / FILE_NAME, mixed()[:1])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99; this ascent reads version 1.*newer ascent"):
        open_store(tmp_path)
    prepare_store(path, keep_through=0)  # a run writing there moves it aside and starts a new store
    assert (tmp_path / (FILE_NAME + ".old")).is_file()
    with open_store(tmp_path) as store:
        assert store.count() == 0 and store.meta["schema_version"] == "1"


def test_a_reader_reads_while_the_writer_writes(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    prepare_store(path, keep_through=0)
    writer = ExperienceWriter(path, decode=decode)
    writer.put([Entry(single(r, 1.0), 1, "trained", trainer_version=0, group_index=r) for r in range(50)])
    store = open_store(tmp_path)
    deadline = time.monotonic() + 30
    while store.count() < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    rows = store.iter_episodes()
    next(rows)  # a read transaction stays open while the writer commits more (WAL: neither waits)
    done = threading.Event()
    writer.put([Entry(single(r, 0.0), 2, "trained", trainer_version=1, group_index=r) for r in range(200)])
    threading.Thread(target=lambda: (writer.close(), done.set()), daemon=True).start()
    assert done.wait(30), "the writer waited for the reader"
    assert len(list(rows)) == 49  # the open read sees the store as it was when it started
    assert store.count() == 250 and store.count(iteration=2) == 200
    store.close()


def test_resume_keeps_the_iterations_up_to_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    write(
        path,
        [Entry(single(r, 1.0), it, "trained", trainer_version=it - 1) for it in (1, 2, 3) for r in (0, 1)],
    )
    write(path, [Entry(single(9, 0.0), 3, "trained", trainer_version=2)], keep_through=2)
    with open_store(tmp_path) as store:
        assert [(r.iteration, r.row_id) for r in store.episodes()] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 9)]
    write(path, [], keep_through=0)  # a new run from the start keeps nothing
    with open_store(tmp_path) as store:
        assert store.count() == 0


def test_sft_rows_take_the_best_finished_single_turn_episode_per_row(tmp_path: Path) -> None:
    from ascent.data.sft import validate_responses
    from ascent.data.validation import validate_rows

    entries = [*mixed(), Entry(single(1, 2.0, finish="length"), 2, "trained", trainer_version=1)]
    write(tmp_path / FILE_NAME, entries)
    with open_store(tmp_path) as store:
        rows = store.to_sft_rows()
        assert [(r["row_id"], r["reward"], r["episode_id"]) for r in rows] == [
            (0, 1.0, 1),
            (1, 1.0, 3),
            (2, 0.5, 5),
        ]
        assert rows[0]["prompt_ids"] == [1, 2, 0] and rows[0]["response"] == decode([0, 1, 2])
        assert [r["row_id"] for r in store.to_sft_rows(min_reward=0.6, status="trained")] == [0]
    validate_rows(rows, "store", tokenizer_vocab_size=100)  # what `ascent sft` checks first
    validate_responses(rows, "store", "response")


def test_export_jsonl_and_parquet(tmp_path: Path) -> None:
    write(tmp_path / FILE_NAME, mixed())
    with open_store(tmp_path) as store:
        assert export(store.iter_episodes(status="trained"), tmp_path / "out.jsonl") == 3
        assert export(store.iter_episodes(), tmp_path / "out.parquet") == 5
        with pytest.raises(StoreError, match="unknown format .csv"):
            export(store.iter_episodes(), tmp_path / "out.csv")
        first = store.episode(4)
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == [1, 2, 4] and lines[2]["response_ids"] == first.response_ids
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [x["status"] for x in table] == ["trained", "trained", "dropped_stale", "trained", "filtered"]
    assert table[3]["sampler_logprobs"] == first.sampler_logprobs
    assert json.loads(table[3]["metadata"]) == first.metadata


def test_a_slow_disk_bounds_the_queue_and_a_failing_one_costs_only_the_store(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / FILE_NAME
    prepare_store(path, keep_through=0)
    real_row = ExperienceWriter._row
    monkeypatch.setattr(ExperienceWriter, "_row", lambda self, e: (time.sleep(0.02), real_row(self, e))[1])
    writer = ExperienceWriter(path, decode=decode, max_queued_tokens=10)  # one 6-token episode at a time
    writer.put([Entry(single(r, 1.0), 1, "trained", trainer_version=0) for r in range(8)])
    assert writer.waited_s > 0  # the loop waited for room instead of queueing without bound
    writer.close()
    assert writer.written == 8

    def broken(self, e):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ExperienceWriter, "_row", broken)
    writer = ExperienceWriter(path, decode=decode, max_queued_tokens=10)
    writer.put([Entry(single(r, 1.0), 2, "trained", trainer_version=1) for r in range(20)])  # never blocks
    writer.close()
    assert isinstance(writer.error, OSError) and writer.written == 0
    with open_store(tmp_path) as store:
        assert store.count() == 8


def test_a_bad_row_costs_its_episode_only(tmp_path: Path, caplog) -> None:
    path = tmp_path / FILE_NAME
    prepare_store(path, keep_through=0)
    writer = ExperienceWriter(path, decode=decode)
    unserializable = replace(single(3, 1.0), reward_components={"x": object()})  # type: ignore[dict-item]
    entries = [single(0, 1.0), single(1, math.nan), single(2, math.inf), unserializable, single(4, 0.5)]
    with caplog.at_level(logging.WARNING, logger="ascent"):
        writer.put([Entry(e, 1, "trained", trainer_version=0, group_index=0) for e in entries])
        writer.close()
    assert writer.error is None and writer.written == 2 and writer.bad_rows == 3
    assert "episode of row 2 (iteration 1) not stored: ValueError: its reward is nan" in caplog.text
    assert "episode of row 4 (iteration 1) not stored: TypeError: Object of type object" in caplog.text
    with open_store(tmp_path) as store:
        assert [r.row_id for r in store.iter_episodes()] == [0, 4]


def test_a_locked_file_delays_the_writes_and_loses_none(tmp_path: Path, caplog) -> None:
    path = tmp_path / FILE_NAME
    prepare_store(path, keep_through=0)
    writer = ExperienceWriter(path, decode=decode, lock_timeout_s=0.2)
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another connection holds the file, as a long transaction would
    try:
        with caplog.at_level(logging.WARNING, logger="ascent"):
            writer.put([Entry(single(r, 1.0), 1, "trained", trainer_version=0) for r in range(5)])
            deadline = time.monotonic() + 30
            while writer.locked_since is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert writer.locked_since is not None and writer.written == 0
            writer.put([Entry(single(r, 0.0), 2, "trained", trainer_version=1) for r in range(5)])  # queued
            time.sleep(1.0)  # a few retries meet the lock
        holder.execute("ROLLBACK")
        writer.close()
    finally:
        holder.close()
    assert writer.error is None and writer.written == 10 and writer.dropped == 0
    assert f"experience store: {path} is locked (database is locked; " in caplog.text
    assert "a connection in this process holds it" in caplog.text  # no other process has it open
    with open_store(tmp_path) as store:
        assert store.count() == 10


def test_a_full_queue_drops_and_counts_while_the_file_is_locked(tmp_path: Path, caplog) -> None:
    path = tmp_path / FILE_NAME
    prepare_store(path, keep_through=0)
    writer = ExperienceWriter(path, decode=decode, max_queued_tokens=10, lock_timeout_s=0.2)  # one episode
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with caplog.at_level(logging.WARNING, logger="ascent"):
            writer.put([Entry(single(r, 1.0), 1, "trained", trainer_version=0) for r in range(4)])  # returns
        holder.execute("ROLLBACK")
        writer.close()
    finally:
        holder.close()
    assert writer.written == 1 and writer.dropped == 3 and writer.error is None
    assert "new episodes are dropped until it is free (counted)" in caplog.text
    assert (
        "holds 1 episodes; 0 could not be written (bad rows, logged above) and 3 were dropped" in caplog.text
    )


@pytest.mark.parametrize(
    "mask",
    [[], [1], [1, 1, 1], [0, 0], [1, 1, 0, 0, 0, 1], [0, 1, 0, 1], [1, 0, 0, 1, 1, 1, 0]],
)
def test_mask_runs_are_the_runs_of_equal_values(mask) -> None:
    """(value, start, end) for every run, in order, covering the mask exactly once."""
    runs = mask_runs(mask)
    assert [v for value, start, end in runs for v in [value] * (end - start)] == mask
    assert all(a[2] == b[1] and a[0] != b[0] for a, b in zip(runs, runs[1:], strict=False))
