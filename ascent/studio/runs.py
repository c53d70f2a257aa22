"""The runs under a studio's RUNS_DIR: where they are, what state each is in, and their headline metrics.

A run directory is a directory holding `metrics.jsonl` or `config.yaml`, found up to `MAX_DEPTH` levels
below RUNS_DIR (a run's own subdirectories are not searched). Its state comes from `<run_dir>/status.json`
(written by the run's status sink, see the contract in `status_state`), checked against the run-dir lock:
a run that says "running" while no live process holds its lock was killed (SIGKILL, power loss) and counts
as crashed. Older runs have no status.json; their state is inferred from the lock and metrics.jsonl.
Run ids are paths relative to RUNS_DIR; `resolve_run` turns one back into a directory and refuses any id
that would leave RUNS_DIR, a symlink to a folder elsewhere included (`find_runs` does not list those).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ascent.config.loader import CONFIG_FILE
from ascent.errors import AscentError
from ascent.studio.metrics import MetricsCache
from ascent.tracking import status as status_file
from ascent.tracking.experience_store import FILE_NAME as STORE_FILE
from ascent.tracking.metrics import METRICS_FILE
from ascent.tracking.runlock import lock_is_held, lock_owner
from ascent.tracking.status import STATUS_FILE
from ascent.tracking.timeline import TRACE_FILE

MAX_DEPTH = 4
RUN_MARKERS = (METRICS_FILE, CONFIG_FILE)
SKIP_DIRS = {"checkpoints", "tensorboard", "logs", "__pycache__", "node_modules", "wandb", "mlruns"}
HEADLINE_KEYS = ("reward/mean", "val/accuracy", "sft/nll", "val/nll")
STATES = (*status_file.STATES, "unknown")  # unknown: no status.json, and too little to infer from


class RunNotFound(AscentError):
    """A run id that names no run directory under RUNS_DIR."""


@dataclass
class RunStatus:
    """A run's state and where it stands. `source` says how the state was found (status.json or inferred)."""

    state: str
    source: str
    detail: str = ""
    step: int | None = None
    total_steps: int | None = None
    kind: str | None = None
    pid: int | None = None
    started_at: float | None = None
    updated_at: float | None = None
    error: str | None = None
    headline: dict[str, float] = field(default_factory=dict)


def find_runs(root: Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Run directories under `root` (itself included), sorted by path; hidden and bulky folders skipped, and
    so is a symlink that leads out of `root` (`resolve_run` refuses it: a listed run always opens)."""
    found: list[Path] = []
    inside = root.resolve()

    def walk(path: Path, depth: int) -> None:
        if any((path / marker).is_file() for marker in RUN_MARKERS):
            found.append(path)
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in path.iterdir() if p.is_dir())
        except OSError:  # unreadable or vanished meanwhile
            return
        for child in children:
            if child.name.startswith(".") or child.name in SKIP_DIRS:
                continue
            if child.is_symlink() and not child.resolve().is_relative_to(inside):
                continue
            walk(child, depth + 1)

    walk(root, 0)
    return found


def run_id(root: Path, run_dir: Path) -> str:
    """The id the API uses for `run_dir`: its path relative to `root` ("." for root itself)."""
    return run_dir.relative_to(root).as_posix() or "."


def resolve_run(root: Path, rid: str) -> Path:
    """The run directory `rid` names under `root`; RunNotFound when it is not a run dir inside root."""
    path = (root / rid).resolve()
    if path != root.resolve() and root.resolve() not in path.parents:
        raise RunNotFound(f"run {rid!r} is outside the studio's runs directory {root}.")
    if not path.is_dir() or not any((path / marker).is_file() for marker in RUN_MARKERS):
        raise RunNotFound(f"run {rid!r}: no run directory (metrics.jsonl or config.yaml) at {path}.")
    return path


def run_status(run_dir: Path, metrics: MetricsCache) -> RunStatus:
    """The run's state, step and headline metrics, from status.json when there is one, else inferred."""
    records = metrics.records(run_dir)
    held = lock_is_held(run_dir)
    status = status_file.read_status(run_dir)
    out = status_state(status, held) if status is not None else inferred_state(run_dir, records, held)
    if records:
        out.step = out.step if out.step is not None else _int(records[-1].get("step"))
        out.updated_at = out.updated_at or _float(records[-1].get("time"))
    out.headline = headline(records)
    return out


def status_state(status: dict[str, Any], held: bool | None) -> RunStatus:
    """State from status.json (schema 1: state, kind, pid, host, command, started_at, updated_at, step,
    total_steps, error). "running" without a live lock holder means the process died without a word."""
    state, detail = str(status["state"]), ""
    if state == "running" and held is False:
        state, detail = "crashed", "status.json says running, but no process holds the run's lock (killed?)"
    elif state == "running" and held is None:
        detail = "status.json says running; the run has no lock file to confirm it"
    return RunStatus(
        state=state,
        source=STATUS_FILE,
        detail=detail,
        step=_int(status.get("step")),
        total_steps=_int(status.get("total_steps")),
        kind=status.get("kind"),
        pid=_int(status.get("pid")),
        started_at=_float(status.get("started_at")),
        updated_at=_float(status.get("updated_at")),
        error=status.get("error"),
    )


def inferred_state(run_dir: Path, records: list[dict[str, Any]], held: bool | None) -> RunStatus:
    """A run without status.json (older ascent): running while its lock is held; otherwise finished when
    metrics reached the configured iterations, else it stopped early (crashed or interrupted: unknown
    which)."""
    total = configured_steps(run_dir)
    owner = lock_owner(run_dir)
    last = _int(records[-1].get("step")) if records else None
    if held:
        state, detail = "running", "a live process holds the run's lock"
    elif total is not None and last is not None and last >= total:
        state, detail = "finished", f"metrics reached step {last} of {total}"
    elif last is None:
        state, detail = "unknown", "no metrics yet, and no process holds the run"
    elif total is None:
        state, detail = "finished", "no process holds the run; its length is unknown"
    else:
        state, detail = "crashed", f"stopped at step {last} of {total} (no status.json: crash or interrupt)"
    return RunStatus(
        state=state,
        source="inferred",
        detail=detail,
        total_steps=total,
        kind=config_kind(run_dir),
        pid=_int(owner.get("pid")),
        started_at=_float(owner.get("started")),
    )


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.yaml as a dict ({} when absent or unreadable)."""

    try:
        data = yaml.safe_load((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def configured_steps(run_dir: Path) -> int | None:
    """`iterations` of the run's config.yaml (RL runs); None for SFT runs and unreadable configs."""
    value = read_config(run_dir).get("iterations")
    return value if isinstance(value, int) else None


def config_kind(run_dir: Path) -> str | None:
    """ "sft" or "train" as the run's config.yaml reads (an SFT config has `epochs`, an RL one
    `iterations`)."""
    data = read_config(run_dir)
    return "sft" if "epochs" in data else "train" if "iterations" in data else None


def headline(records: list[dict[str, Any]]) -> dict[str, float]:
    """The latest value of each HEADLINE_KEYS metric present (validation metrics come every few steps)."""
    out: dict[str, float] = {}
    for record in reversed(records):
        for key in HEADLINE_KEYS:
            value = record.get(key)
            if key not in out and isinstance(value, int | float):
                out[key] = float(value)
        if len(out) == len(HEADLINE_KEYS):
            break
    return {key: out[key] for key in HEADLINE_KEYS if key in out}


def describe_runs(root: Path, metrics: MetricsCache) -> list[dict[str, Any]]:
    """One `describe_run` entry per run under `root`."""
    return [describe_run(root, run_dir, metrics) for run_dir in find_runs(root)]


def describe_run(root: Path, run_dir: Path, metrics: MetricsCache) -> dict[str, Any]:
    """A JSON-ready entry: id, path, status fields, which views it has data for, and `trace_hint` (why the
    timeline is empty, when it is)."""
    status = run_status(run_dir, metrics)
    if status.kind is None:
        status.kind = config_kind(run_dir)
    has_trace = (run_dir / TRACE_FILE).is_file()
    return {
        "id": run_id(root, run_dir),
        "path": str(run_dir),
        **asdict(status),
        "has_metrics": (run_dir / METRICS_FILE).is_file(),
        "has_trace": has_trace,
        "has_episodes": (run_dir / STORE_FILE).is_file(),
        "has_config": (run_dir / CONFIG_FILE).is_file(),
        "trace_hint": None if has_trace else trace_hint(run_dir, status),
        "modified": _mtime(run_dir),
    }


def run_kind(run_dir: Path) -> str | None:
    """ "train" or "sft": what status.json says, else what config.yaml reads as (None: unknown)."""
    kind = (status_file.read_status(run_dir) or {}).get("kind")
    return kind if isinstance(kind, str) else config_kind(run_dir)


def trace_hint(run_dir: Path, status: RunStatus) -> str:
    """Why a run has no trace.json: SFT writes none; an RL run may have turned it off or not got there yet."""
    if status.kind == "sft":
        return (
            "SFT runs have no phase timeline: only `ascent train` writes trace.json (one row per RL phase)."
        )
    tracking = read_config(run_dir).get("tracking")
    if isinstance(tracking, dict) and tracking.get("trace") is False:
        return "This run turned the timeline off (tracking.trace=false); rerun with tracking.trace=true."
    if status.state == "running":
        return "No phases recorded yet: trace.json is written once the first iteration finishes."
    return "This run left no trace.json (tracking.trace=true writes it during `ascent train`)."


def _mtime(run_dir: Path) -> float:
    times = [os.stat(p).st_mtime for name in (*RUN_MARKERS, STATUS_FILE) if (p := run_dir / name).exists()]
    return max(times, default=0.0)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
