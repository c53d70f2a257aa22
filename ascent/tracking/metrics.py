"""`<run_dir>/metrics.jsonl`, the run's metrics of record: its sink on the tracking bus and its reader.

`JsonlSink` writes one JSON object per `Metrics` event with `step`, `time` (unix seconds) and the metrics,
flushed line by line so a crash loses nothing already logged. Non-finite values are written as `null` (JSON
has no NaN). Resuming appends to the same file after dropping what a crashed run logged past the checkpoint
it resumes from. `read_metrics` reads the file back (the studio, tests, scripts).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, TextIO

from ascent.tracking.events import Event, Metrics, RunStarted

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
_RESERVED_KEYS = ("step", "time")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file (or of `<path>/metrics.jsonl` when `path` is a run directory).

    Blank lines are skipped, and so is a line that does not parse (a crash mid-write leaves at most one).
    """
    file = Path(path)
    if file.is_dir():
        file = file / METRICS_FILE
    if not file.exists():
        return []
    records = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s:%d is not valid JSON (interrupted write?); skipped", file, number)
    return records


def _purge_jsonl(file: Path, purge_step: int) -> None:
    """Rewrite `file` atomically without the records whose step is >= purge_step."""
    kept = [r for r in read_metrics(file) if not isinstance(r.get("step"), int) or r["step"] < purge_step]
    tmp = file.with_name(file.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in kept)
    os.replace(tmp, file)


class JsonlSink:
    """Append each `Metrics` event to `<run_dir>/metrics.jsonl`; on `RunStarted` of a resumed run, first drop
    the records at or after the step it continues from (the file is rewritten atomically)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = None

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            if self.path.exists():
                _purge_jsonl(self.path, event.resume_step + 1)
            self._file = self.path.open("a", encoding="utf-8")
        elif isinstance(event, Metrics):
            if self._file is None:  # metrics without a RunStarted (a script driving the bus by hand)
                self._file = self.path.open("a", encoding="utf-8")
            values = {k: v for k, v in event.values.items() if k not in _RESERVED_KEYS}
            record = {"step": event.step, "time": round(event.time, 3), **values}
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
