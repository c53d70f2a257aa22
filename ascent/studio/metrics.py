"""Reading a run's metrics.jsonl while the run appends to it, for the studio's live plots.

`MetricsCache` keeps the records of every file it has read and, on the next call, parses only the bytes
appended since (the file is flushed line by line by `ascent.tracking.metrics.JsonlSink`; a line without
its newline yet is left for the next call). A file replaced meanwhile (a resumed run purges the steps after
its checkpoint by rewriting the file) is read again from the start, and its `generation` changes so a
client knows to drop what it plotted. `group_of` sorts metric names into the plot groups the UI shows.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ascent.studio import catalog
from ascent.tracking.metrics import METRICS_FILE

# plot groups in display order: (group, metric-name prefixes). Names without a prefix are trainer
# statistics (grad_norm, entropy, clipfrac, ...) and go with `train/` and `loss/`.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/",)),
    ("val", ("val/",)),
    ("rollout", ("rollout/",)),
    ("train", ("train/", "loss/", "sft/")),
    ("time", ("time/",)),
    ("perf", ("perf/",)),
)
RESERVED = ("step", "time")


def group_of(key: str) -> str:
    """The plot group of a metric name: a known prefix's group, `train` for bare names, else the prefix."""
    for group, prefixes in GROUPS:
        if key.startswith(prefixes):
            return group
    return key.split("/", 1)[0] if "/" in key else "train"


def group_order(group: str) -> tuple[int, str]:
    known = [g for g, _ in GROUPS]
    return (known.index(group), group) if group in known else (len(known), group)


@dataclass
class _File:
    inode: int = -1
    offset: int = 0
    generation: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)


class MetricsCache:
    """Parsed metrics.jsonl records per run directory, read incrementally; thread-safe."""

    def __init__(self) -> None:
        self._files: dict[Path, _File] = {}
        self._lock = threading.Lock()

    def records(self, run_dir: Path) -> list[dict[str, Any]]:
        """Every record of `<run_dir>/metrics.jsonl` so far (a copy of the list; [] when there is none)."""
        return list(self._refresh(run_dir).records)

    def since(self, run_dir: Path, step: int) -> tuple[int, list[dict[str, Any]]]:
        """(generation, records whose step is > `step`)."""
        entry = self._refresh(run_dir)
        newer = [r for r in entry.records if isinstance(r.get("step"), int) and r["step"] > step]
        return entry.generation, newer

    def _refresh(self, run_dir: Path) -> _File:
        path = run_dir / METRICS_FILE
        with self._lock:
            entry = self._files.setdefault(path, _File())
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                if entry.records:
                    self._files[path] = entry = _File(generation=entry.generation + 1)
                return entry
            if stat.st_ino != entry.inode or stat.st_size < entry.offset:
                fresh = entry.inode != -1
                entry = self._files[path] = _File(inode=stat.st_ino, generation=entry.generation + fresh)
            if stat.st_size > entry.offset:
                self._read_new(path, entry)
            return entry

    @staticmethod
    def _read_new(path: Path, entry: _File) -> None:
        with path.open("rb") as f:
            f.seek(entry.offset)
            chunk = f.read()
        complete = chunk.rfind(b"\n") + 1  # only whole lines; the rest is still being written
        for line in chunk[:complete].splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue  # at most one torn line after a crash; read_metrics skips it too
            if isinstance(record, dict):
                entry.records.append(record)
        entry.offset += complete


def series(records: list[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Records -> {metric: {"step": [...], "time": [...], "value": [...]}} for numeric values (nulls kept as
    gaps); `time` is the record's unix time (None when it has none), for the wall-clock axis."""
    out: dict[str, dict[str, list[Any]]] = {}
    for record in records:
        step = record.get("step")
        if not isinstance(step, int):
            continue
        when = record.get("time")
        when = when if isinstance(when, int | float) else None
        for key, value in record.items():
            if key in RESERVED or not (value is None or isinstance(value, int | float)):
                continue
            column = out.setdefault(key, {"step": [], "time": [], "value": []})
            column["step"].append(step)
            column["time"].append(when)
            column["value"].append(value)
    return out


def metrics_payload(
    run_dir: Path, cache: MetricsCache, since: int, kind: str | None = None
) -> dict[str, Any]:
    """What `/api/metrics` answers: the generation, the last step, the run's first record time (`t0`, the
    wall-clock axis's zero), the x-axis title, and the new points grouped by metric with each one's unit.
    A run of `kind` "sft" gets its own charts (`catalog`: throughput derived, RL-only statistics left out)."""
    generation, records = cache.since(run_dir, -1 if kind == "sft" else since)
    if kind == "sft":
        records = [r for r in catalog.with_sft_throughput(records) if r["step"] > since]
    data = {k: v for k, v in series(records).items() if catalog.shown(k, kind)}
    steps = [r["step"] for r in records]
    first = cache.records(run_dir)[:1]
    t0 = first[0].get("time") if first else None
    return {
        "generation": generation,
        "last_step": max(steps) if steps else since,
        "kind": kind,
        "x_title": catalog.X_TITLES.get(kind or "train", "step"),
        "t0": t0 if isinstance(t0, int | float) else None,
        "series": data,
        "groups": {key: group_of(key) for key in data},
        "units": {key: catalog.unit_of(key, kind) for key in data},
    }
