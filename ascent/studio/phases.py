"""The phases of one iteration, read from a run's Chrome-trace timeline, for the studio's Gantt chart.

`ascent.tracking.timeline.Timeline` writes `<run_dir>/trace.json` (rewritten atomically at every flush):
one complete event (`"ph": "X"`, microseconds) per phase, tagged `args.iteration`, on a process row per
worker (`process_name` metadata). Phases nest (`rollout` holds `generate` and `reward`); `depth` says how
deep each one sits among the phases of its row, so the chart can indent it.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

from ascent.tracking.timeline import TRACE_FILE


def read_trace(run_dir: Path) -> list[dict[str, Any]]:
    """The trace's events ([] when the run has no trace or it does not parse)."""
    try:
        data = json.loads((run_dir / TRACE_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return []
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def iteration_phases(run_dir: Path, iteration: int | None = None) -> dict[str, Any]:
    """{iterations: [...], iteration, phases: [{name, process, start_s, duration_s, depth, args}]}: the
    phases of `iteration` (None: the latest), start times in seconds from the iteration's first phase."""
    events = read_trace(run_dir)
    processes = {
        e.get("pid"): e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    phases = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), int | float)]
    of = iteration_of(phases)
    iterations = sorted({it for it in of.values() if it is not None})
    if iteration is None and iterations:
        iteration = iterations[-1]
    chosen = sorted(
        (e for e in phases if of[id(e)] == iteration),
        key=lambda e: (e["ts"], -e.get("dur", 0)),
    )
    origin = chosen[0]["ts"] if chosen else 0
    rows = []
    open_ends: dict[tuple[Any, Any], list[float]] = {}
    for e in chosen:
        end = e["ts"] + e.get("dur", 0)
        stack = open_ends.setdefault((e.get("pid"), e.get("tid")), [])
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        rows.append(
            {
                "name": str(e.get("name", "?")),
                "process": processes.get(e.get("pid"), str(e.get("pid"))),
                "start_s": (e["ts"] - origin) / 1e6,
                "duration_s": e.get("dur", 0) / 1e6,
                "depth": len(stack),
                "args": e.get("args", {}),
            }
        )
        stack.append(end)
    return {"iterations": iterations, "iteration": iteration, "phases": rows}


def iteration_of(phases: list[dict[str, Any]]) -> dict[int, int | None]:
    """id(event) -> its iteration: `args.iteration`, else that of the tagged phase on the same row that
    encloses it (a nested phase opened without `iteration=` inherits it but does not record it)."""
    tagged: dict[tuple[Any, Any], list[tuple[float, float, int]]] = {}
    out: dict[int, int | None] = {}
    for e in phases:
        it = e.get("args", {}).get("iteration")
        out[id(e)] = it if isinstance(it, int) else None
        if out[id(e)] is not None:
            tagged.setdefault((e.get("pid"), e.get("tid")), []).append(
                (e["ts"], e["ts"] + e.get("dur", 0), it)
            )
    for row in tagged.values():
        row.sort()
    for e in phases:
        if out[id(e)] is None:
            row = tagged.get((e.get("pid"), e.get("tid")), [])
            i = bisect.bisect_right(row, (e["ts"], float("inf"), 0)) - 1
            if i >= 0 and row[i][1] >= e["ts"] + e.get("dur", 0):
                out[id(e)] = row[i][2]
    return out
