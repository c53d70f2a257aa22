"""`<run_dir>/status.json`: whether a run is running, finished, crashed or was interrupted, for the studio and
for scripts.

`StatusSink` rewrites the file atomically (temp file + rename) at `RunStarted`, after every `Metrics` event
(a heartbeat: `updated_at` and `step`) and at `RunEnded`:

    {"schema": 1, "state": "running"|"finished"|"crashed"|"interrupted", "kind": "train"|"sft", "pid": int,
     "host": str, "command": [argv...], "started_at": unix_s, "updated_at": unix_s, "step": int|null,
     "total_steps": int|null, "error": str|null}

A run killed with SIGKILL leaves "running"; a reader tells it from a live run by the run-directory lock
(`<run_dir>/.ascent.lock`, held by the live process; see ascent/orchestrator/rundir.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, get_args

from ascent.tracking.events import EndState, Event, Metrics, RunEnded, RunStarted

STATUS_FILE = "status.json"
SCHEMA = 1
STATES = ("running", *get_args(EndState))  # every state the file can hold


def read_status(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's status.json as a dict; None when there is none (runs from before it existed), it is
    unreadable, or its `state` is none of STATES (the file is replaced atomically, so a partial or foreign
    file is a writer that does not follow the contract: treated as absent)."""
    try:
        data = json.loads((Path(run_dir) / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("state") in STATES else None


class StatusSink:
    """Keep `<run_dir>/status.json` current with the run's events."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / STATUS_FILE
        self.status: dict[str, Any] | None = None

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.status = {
                "schema": SCHEMA,
                "state": "running",
                "kind": event.kind,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": list(sys.argv),
                "started_at": event.time,
                "updated_at": event.time,
                "step": event.resume_step or None,
                "total_steps": event.total_steps,
                "error": None,
            }
        elif self.status is None:  # nothing to say before the run has started
            return
        elif isinstance(event, Metrics):
            self.status.update(step=event.step, updated_at=event.time)
        elif isinstance(event, RunEnded):
            self.status.update(state=event.state, error=event.error, updated_at=event.time)
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.status, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Nothing held open: every event already rewrote the file."""
