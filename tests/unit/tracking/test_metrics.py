"""MetricsLogger: JSONL lines, TensorBoard scalars, resume, wandb wiring."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from ascent.tracking import MetricsLogger, read_metrics


def test_jsonl_one_line_per_call_with_step_and_time(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log({"reward/mean": 0.5, "count": 3}, step=1)
        logger.log({"reward/mean": 0.75}, step=2)
        assert len(logger.path.read_text().splitlines()) == 2  # flushed before close
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["reward/mean"] == 0.5 and records[0]["count"] == 3
    assert all(isinstance(r["time"], float) for r in records)


def test_non_finite_and_odd_values_never_crash(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=True) as logger:
        logger.log(
            {
                "nan": float("nan"),
                "inf": float("inf"),
                "t": torch.tensor(2.5),
                "flag": True,
                "none": None,
                "s": "x",
            },
            step=0,
        )
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    assert "NaN" not in line and "Infinity" not in line
    record = json.loads(line)
    assert record["nan"] is None and record["inf"] is None
    assert record["t"] == 2.5 and record["flag"] == 1 and record["s"] == "x"


def test_resume_appends_and_purges_what_came_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in range(4):
            logger.log({"x": step}, step=step)
    with MetricsLogger(tmp_path, tensorboard=False, purge_step=2) as logger:
        logger.log({"x": 20}, step=2)
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(0, 0), (1, 1), (2, 20)]
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log({"x": 30}, step=3)
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 4


def test_read_metrics_skips_a_truncated_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n{"step": 1, "x"')
    assert read_metrics(tmp_path) == [{"step": 0, "x": 1}]
    assert read_metrics(tmp_path / "missing") == []


def test_tensorboard_event_file_holds_the_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path) as logger:
        logger.log({"reward/mean": 0.25, "bad": float("nan")}, step=3)
        logger.log({"reward/mean": 0.5}, step=4)
    tb_dir = tmp_path / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tb_dir))
    events.Reload()
    assert "bad" not in events.Tags()["scalars"]
    scalars = events.Scalars("reward/mean")
    assert [(s.step, s.value) for s in scalars] == [(3, 0.25), (4, 0.5)]


def test_wandb_requested_but_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(RuntimeError, match=r"tracking.wandb_project='proj'.*pip install wandb"):
        MetricsLogger(tmp_path, tensorboard=False, wandb_project="proj")


def test_wandb_gets_numbers_and_a_stable_run_id(tmp_path, monkeypatch):
    calls: list[tuple] = []

    class FakeRun:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    for _ in range(2):
        with MetricsLogger(tmp_path, tensorboard=False, wandb_project="proj") as logger:
            logger.log({"a": 1.0, "s": "text", "n": float("nan")}, step=5)
    inits = [c[1] for c in calls if c[0] == "init"]
    assert inits[0]["project"] == "proj" and inits[0]["id"] == inits[1]["id"]
    assert ("log", {"a": 1.0}, 5) in calls and calls[-1] == ("finish",)
