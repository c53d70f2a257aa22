"""Finding runs under RUNS_DIR and telling their state: status.json checked against the run-dir lock, and
the inference for runs written before status.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ascent.orchestrator.rundir import RunDirLock  # the lock a run takes; the studio probes it on its own
from ascent.studio.metrics import MetricsCache
from ascent.studio.runs import (
    RunNotFound,
    describe_run,
    describe_runs,
    find_runs,
    resolve_run,
    run_status,
)
from ascent.tracking.runlock import lock_is_held

from .conftest import make_run


def write_status(run_dir: Path, state: str, **extra) -> None:
    status = {
        "schema": 1,
        "state": state,
        "kind": "train",
        "pid": 4242,
        "host": "h",
        "command": ["ascent"],
        "started_at": time.time() - 60,
        "updated_at": time.time(),
        "step": 2,
        "total_steps": 3,
        "error": None,
    } | extra
    (run_dir / "status.json").write_text(json.dumps(status))


def test_runs_are_found_a_few_levels_deep_and_their_insides_are_not_searched(runs_root: Path) -> None:
    (runs_root / "notes").mkdir()
    make_run(runs_root / "b", episodes=False)
    (runs_root / "sweep" / "lr1" / "run" / "checkpoints" / "iter_000001").mkdir(parents=True)
    (runs_root / "sweep" / "lr1" / "run" / "checkpoints" / "iter_000001" / "config.yaml").write_text("x: 1\n")
    (runs_root / "a" / "b" / "c" / "d" / "e").mkdir(parents=True)
    (runs_root / "a" / "b" / "c" / "d" / "e" / "metrics.jsonl").write_text("")
    found = [p.relative_to(runs_root).as_posix() for p in find_runs(runs_root)]
    assert found == ["b", "sweep/lr1/run"]


def test_a_run_id_cannot_leave_the_runs_directory(runs_root: Path, tmp_path: Path) -> None:
    make_run(tmp_path / "outside", episodes=False)
    assert resolve_run(runs_root, "sweep/lr1/run") == (runs_root / "sweep/lr1/run").resolve()
    for bad in ("../outside", "/etc", "sweep", "nope"):
        with pytest.raises(RunNotFound):
            resolve_run(runs_root, bad)


def test_a_symlink_out_of_the_runs_directory_is_neither_listed_nor_opened(
    runs_root: Path, tmp_path: Path
) -> None:
    make_run(tmp_path / "elsewhere" / "run", episodes=False)
    (runs_root / "linked").symlink_to(tmp_path / "elsewhere" / "run")
    (runs_root / "alias").symlink_to(runs_root / "sweep")  # a symlink that stays inside is a run as any other
    found = [p.relative_to(runs_root).as_posix() for p in find_runs(runs_root)]
    assert found == ["alias/lr1/run", "sweep/lr1/run"]
    assert [r["id"] for r in describe_runs(runs_root, MetricsCache())] == found
    for listed in found:
        resolve_run(runs_root, listed)
    with pytest.raises(RunNotFound):
        resolve_run(runs_root, "linked")


def test_status_json_running_is_believed_only_while_the_lock_is_held(runs_root: Path) -> None:
    run = runs_root / "sweep/lr1/run"
    write_status(run, "running")
    lock = RunDirLock(run).acquire()
    try:
        assert lock_is_held(run) is True
        status = run_status(run, MetricsCache())
        assert (status.state, status.source, status.step, status.total_steps) == (
            "running",
            "status.json",
            2,
            3,
        )
    finally:
        lock.release()
    assert lock_is_held(run) is False
    killed = run_status(run, MetricsCache())
    assert killed.state == "crashed" and "lock" in killed.detail


@pytest.mark.parametrize("state", ["finished", "interrupted", "crashed"])
def test_status_json_end_states_pass_through_with_the_error(runs_root: Path, state: str) -> None:
    run = runs_root / "sweep/lr1/run"
    write_status(run, state, error="boom: bad reward" if state == "crashed" else None)
    status = run_status(run, MetricsCache())
    assert status.state == state
    assert status.error == ("boom: bad reward" if state == "crashed" else None)


def test_without_status_json_the_state_is_inferred(tmp_path: Path) -> None:
    done = make_run(tmp_path / "done", steps=3, iterations=3, episodes=False)
    short = make_run(tmp_path / "short", steps=2, iterations=5, episodes=False)
    assert lock_is_held(done) is None  # no lock file: never run by ascent train
    assert run_status(done, MetricsCache()).state == "finished"
    stopped = run_status(short, MetricsCache())
    assert (stopped.state, stopped.source, stopped.step) == ("crashed", "inferred", 2)
    lock = RunDirLock(short).acquire()
    try:
        assert run_status(short, MetricsCache()).state == "running"
    finally:
        lock.release()


def test_describe_runs_has_headline_metrics_and_views(runs_root: Path) -> None:
    (entry,) = describe_runs(runs_root, MetricsCache())
    assert entry["id"] == "sweep/lr1/run"
    assert entry["step"] == 3
    assert entry["headline"] == {"reward/mean": pytest.approx(0.3), "val/accuracy": 0.25}
    assert entry["has_metrics"] and entry["has_trace"] and entry["has_episodes"] and entry["has_config"]


def test_kind_and_trace_hint_fit_what_the_run_is(runs_root: Path) -> None:
    rl = runs_root / "sweep" / "lr1" / "run"
    assert describe_run(runs_root, rl, MetricsCache())["trace_hint"] is None  # it has a trace
    (rl / "trace.json").unlink()
    rl_entry = describe_run(runs_root, rl, MetricsCache())
    assert rl_entry["kind"] == "train" and "tracking.trace=true writes it" in rl_entry["trace_hint"]
    off = rl / "config.yaml"
    off.write_text(off.read_text().replace("  trace: true", "  trace: false"))
    assert "turned the timeline off" in describe_run(runs_root, rl, MetricsCache())["trace_hint"]
    sft = runs_root / "sft"
    sft.mkdir()
    (sft / "config.yaml").write_text("epochs: 2.0\nbatch_size: 8\n")  # an SFT run from before status.json
    entry = describe_run(runs_root, sft, MetricsCache())
    assert entry["kind"] == "sft" and not entry["has_trace"] and not entry["has_episodes"]
    assert entry["trace_hint"].startswith("SFT runs have no phase timeline")
