"""Timeline: valid Chrome-trace JSON, nested phases, durations, worker events."""

from __future__ import annotations

import json
import time

from ascent.tracking import Timeline


def _complete(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_nested_phases_make_valid_trace(tmp_path):
    path = tmp_path / "trace.json"
    timeline = Timeline(path)
    with timeline.phase("iteration", iteration=3) as outer:
        with timeline.phase("rollout", batch=2):
            time.sleep(0.01)
        with timeline.phase("update"):
            pass
    timeline.flush()
    trace = json.loads(path.read_text())
    events = {e["name"]: e for e in _complete(trace)}
    assert set(events) == {"iteration", "rollout", "update"}
    parent, child = events["iteration"], events["rollout"]
    assert parent["ts"] <= child["ts"] and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"] + 1
    assert child["dur"] >= 10_000  # microseconds
    assert child["args"] == {"batch": 2} and parent["args"] == {"iteration": 3}
    assert {e["pid"] for e in events.values()} == {1} and outer.duration_s >= 0.01
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert names == ["controller"]
    assert not list(tmp_path.glob("*.tmp"))


def test_last_durations_are_per_iteration(tmp_path):
    timeline = Timeline(tmp_path / "t.json")
    for iteration in range(2):
        with timeline.phase("iteration", iteration=iteration):
            for _ in range(2):
                with timeline.phase("generate"):
                    time.sleep(0.005)
    durations = timeline.last_durations()
    assert set(durations) == {"iteration", "generate"}
    assert durations["generate"] >= 0.01  # two phases summed
    assert durations["iteration"] >= durations["generate"]
    assert timeline.durations(0).keys() == durations.keys()


def test_worker_events_get_their_own_process(tmp_path):
    worker = Timeline(None, process_name="rollout_0")
    with worker.phase("generate", iteration=1):
        pass
    events = worker.drain_events()
    assert worker.drain_events() == []
    timeline = Timeline(tmp_path / "t.json")
    with timeline.phase("step"):
        timeline.add_events(events, worker="rollout_0")
        timeline.add_events(events, worker="trainer_0")
    timeline.mark("weights published", version=2)
    timeline.flush()
    trace = json.loads((tmp_path / "t.json").read_text())
    pids = {e["name"] + str(e["pid"]) for e in _complete(trace)}
    assert pids == {"step1", "generate2", "generate3"}
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "controller", 2: "rollout_0", 3: "trainer_0"}
    assert any(e["ph"] == "i" and e["args"] == {"version": 2} for e in trace["traceEvents"])


def test_flush_rewrites_a_valid_file_each_time(tmp_path):
    path = tmp_path / "sub" / "trace.json"
    timeline = Timeline(path)
    timeline.flush()
    assert json.loads(path.read_text())["traceEvents"]
    with timeline.phase("a", obj=object()):
        pass
    timeline.close()
    assert len(_complete(json.loads(path.read_text()))) == 1
