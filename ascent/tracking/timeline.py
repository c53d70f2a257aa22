"""A Chrome-trace timeline of the RL loop's phases (open the file in https://ui.perfetto.dev).

The controller wraps each phase of an iteration (rollout, reward, logprobs, update, weight sync) in
`timeline.phase(name, iteration=i)`; each becomes a complete event (`"ph": "X"`, microseconds). Phases nest.
Workers can keep their own `Timeline(None, process_name=...)`, hand back `drain_events()`, and the controller
merges them with `add_events(events, worker=name)`: each worker name gets its own process row.

`flush()` rewrites the whole file atomically (temp file + rename), so the file on disk is always valid JSON.
`last_durations()` gives the seconds each phase took in the latest iteration, for `time/<phase>` metrics.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_FILE = "trace.json"  # `ascent train` writes `<run_dir>/trace.json`; the studio reads it
_CONTROLLER_PID = 1
_KEEP_ITERATIONS = 4  # durations are kept for this many recent iterations


@dataclass
class PhaseRecord:
    """One timed phase. `duration_s` is set when the phase ends."""

    name: str
    iteration: int | None
    args: dict[str, Any] = field(default_factory=dict)
    start_us: int = 0
    duration_s: float | None = None


def _now_us() -> int:
    """Wall-clock microseconds: comparable between processes on one machine (and roughly across nodes)."""
    return time.time_ns() // 1000


def _jsonable(args: Mapping[str, Any]) -> dict[str, Any]:
    """Event args that json can write (anything else becomes its repr)."""
    out = {}
    for key, value in args.items():
        ok = value is None or isinstance(value, bool | int | float | str)
        out[str(key)] = value if ok else repr(value)
    return out


class Timeline:
    """Record phases as Chrome-trace events; `path=None` keeps them in memory only (for workers)."""

    def __init__(self, path: str | os.PathLike[str] | None, *, process_name: str = "controller") -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._events: list[dict[str, Any]] = []
        self._metadata: list[dict[str, Any]] = []
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, int], int] = {}
        self._durations: OrderedDict[int | None, dict[str, float]] = OrderedDict()
        self._last_iteration: int | None = None
        self._pid_for(process_name)

    # ids -------------------------------------------------------------------------------------------
    def _pid_for(self, process: str) -> int:
        """A stable small pid per process (worker) name, announced with a process_name metadata event."""
        if process not in self._pids:
            pid = _CONTROLLER_PID + len(self._pids)
            self._pids[process] = pid
            self._metadata.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": process}})
            self._metadata.append(
                {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}
            )
        return self._pids[process]

    def _tid_for(self, pid: int, thread_key: int, thread_name: str) -> int:
        """A small tid per (process, thread), announced with a thread_name metadata event."""
        key = (pid, thread_key)
        if key not in self._tids:
            tid = 1 + sum(1 for p, _ in self._tids if p == pid)
            self._tids[key] = tid
            self._metadata.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": thread_name}}
            )
        return self._tids[key]

    def _stack(self) -> list[PhaseRecord]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    # recording -------------------------------------------------------------------------------------
    @contextmanager
    def phase(self, name: str, **args: Any) -> Iterator[PhaseRecord]:
        """Time the body as one complete event. `iteration=` (inherited by nested phases) groups durations."""
        stack = self._stack()
        iteration = args.get("iteration", stack[-1].iteration if stack else None)
        record = PhaseRecord(name=name, iteration=iteration, args=_jsonable(args), start_us=_now_us())
        stack.append(record)
        start = time.perf_counter()
        try:
            yield record
        finally:
            record.duration_s = time.perf_counter() - start
            stack.pop()
            self._finish(record)

    def _finish(self, record: PhaseRecord) -> None:
        thread = threading.current_thread()
        seconds = record.duration_s or 0.0
        event = {
            "name": record.name,
            "cat": "phase",
            "ph": "X",
            "ts": record.start_us,
            "dur": max(1, round(seconds * 1e6)),
            "args": record.args,
        }
        with self._lock:
            pid = _CONTROLLER_PID
            event.update(pid=pid, tid=self._tid_for(pid, thread.ident or 0, thread.name))
            self._events.append(event)
            totals = self._durations.setdefault(record.iteration, {})
            totals[record.name] = totals.get(record.name, 0.0) + seconds
            self._durations.move_to_end(record.iteration)
            while len(self._durations) > _KEEP_ITERATIONS:
                self._durations.popitem(last=False)
            self._last_iteration = record.iteration

    def mark(self, name: str, **args: Any) -> None:
        """An instant event (a vertical line in the viewer), e.g. "weights published"."""
        thread = threading.current_thread()
        with self._lock:
            tid = self._tid_for(_CONTROLLER_PID, thread.ident or 0, thread.name)
            event = {"name": name, "cat": "mark", "ph": "i", "s": "p", "ts": _now_us()}
            self._events.append({**event, "pid": _CONTROLLER_PID, "tid": tid, "args": _jsonable(args)})

    def add_events(self, events: list[dict[str, Any]], *, worker: str) -> None:
        """Merge events recorded elsewhere (a worker's `drain_events()`), shown under the process `worker`."""
        with self._lock:
            pid = self._pid_for(worker)
            for event in events:
                if event.get("ph") == "M":
                    continue
                tid = self._tid_for(pid, int(event.get("tid", 1)), f"{worker}/{event.get('tid', 1)}")
                self._events.append({**event, "pid": pid, "tid": tid})

    def drain_events(self) -> list[dict[str, Any]]:
        """Return and forget the recorded events (a worker sends these to the controller)."""
        with self._lock:
            events, self._events = self._events, []
        return events

    # reading ---------------------------------------------------------------------------------------
    def last_durations(self) -> dict[str, float]:
        """Seconds per phase name in the iteration of the most recently finished phase (repeats summed)."""
        with self._lock:
            return dict(self._durations.get(self._last_iteration, {}))

    def durations(self, iteration: int | None) -> dict[str, float]:
        """Seconds per phase name of one recent iteration (the last few are kept)."""
        with self._lock:
            return dict(self._durations.get(iteration, {}))

    def trace(self) -> dict[str, Any]:
        """The whole trace as a Chrome-trace JSON object."""
        with self._lock:
            return {"traceEvents": [*self._metadata, *self._events], "displayTimeUnit": "ms"}

    def flush(self) -> None:
        """Write the trace to `path` atomically (no-op without a path)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(self.trace(), f, separators=(",", ":"))
        os.replace(tmp, self.path)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> Timeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
