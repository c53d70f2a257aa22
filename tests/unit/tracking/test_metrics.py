"""metrics.jsonl through the tracking bus (JsonlSink) and TensorBoard scalars: lines, odd values, resume."""

from __future__ import annotations

import json

import torch

from ascent.tracking import EventBus, JsonlSink, Metrics, RunStarted, TensorBoardSink, read_metrics


def open_bus(run_dir, *, tensorboard=False, resume_step=0) -> EventBus:
    """What a run does: the sinks, then RunStarted (which purges on resume)."""
    sinks = [JsonlSink(run_dir)] + ([TensorBoardSink(run_dir)] if tensorboard else [])
    bus = EventBus(sinks)
    bus.publish(RunStarted(str(run_dir), "train", {}, total_steps=10, resume_step=resume_step))
    return bus


def log(bus: EventBus, values: dict, step: int) -> None:
    bus.publish(Metrics.of(step, values))


def test_jsonl_one_line_per_event_with_step_and_time(tmp_path):
    bus = open_bus(tmp_path)
    log(bus, {"reward/mean": 0.5, "count": 3}, step=1)
    log(bus, {"reward/mean": 0.75}, step=2)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # flushed before close
    bus.close()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/mean"] == 0.5 and records[0]["count"] == 3
    assert all(isinstance(r["time"], float) for r in records)


def test_non_finite_and_odd_values_never_crash(tmp_path):
    bus = open_bus(tmp_path, tensorboard=True)
    values = {
        "nan": float("nan"),
        "inf": float("inf"),
        "t": torch.tensor(2.5),
        "flag": True,
        "none": None,
        "s": "x",
    }
    log(bus, values, step=0)
    assert len(bus.sinks) == 2  # neither sink raised (a raising sink is dropped)
    bus.close()
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    assert "NaN" not in line and "Infinity" not in line
    record = json.loads(line)
    assert record["nan"] is None and record["inf"] is None
    assert record["t"] == 2.5 and record["flag"] == 1 and record["s"] == "x"


def test_resume_appends_and_purges_what_came_after_the_checkpoint(tmp_path):
    bus = open_bus(tmp_path)
    for step in range(4):
        log(bus, {"x": step}, step=step)
    bus.close()
    bus = open_bus(tmp_path, resume_step=1)  # resumed from the checkpoint of step 1: steps 2.. are redone
    log(bus, {"x": 20}, step=2)
    bus.close()
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(0, 0), (1, 1), (2, 20)]
    bus = open_bus(tmp_path, resume_step=2)
    log(bus, {"x": 30}, step=3)
    bus.close()
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 4


def test_read_metrics_skips_a_truncated_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n{"step": 1, "x"')
    assert read_metrics(tmp_path) == [{"step": 0, "x": 1}]
    assert read_metrics(tmp_path / "missing") == []


def test_tensorboard_event_file_holds_the_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    bus = open_bus(tmp_path, tensorboard=True)
    log(bus, {"reward/mean": 0.25, "bad": float("nan")}, step=3)
    log(bus, {"reward/mean": 0.5}, step=4)
    bus.close()
    tb_dir = tmp_path / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tb_dir))
    events.Reload()
    assert "bad" not in events.Tags()["scalars"]
    scalars = events.Scalars("reward/mean")
    assert [(s.step, s.value) for s in scalars] == [(3, 0.25), (4, 0.5)]
