"""Reading metrics.jsonl while a run appends to it: only new bytes are parsed, a torn last line waits for
its newline, a rewritten file starts a new generation, and metric names fall into plot groups."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ascent.studio.catalog import unit_of
from ascent.studio.metrics import MetricsCache, group_of, metrics_payload


def line(step: int, **metrics) -> str:
    return json.dumps({"step": step, "time": 1.0 + step, **metrics}) + "\n"


def test_appended_lines_arrive_and_a_torn_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(0, **{"val/accuracy": 0.5}) + line(1, **{"reward/mean": 0.1}))
    cache = MetricsCache()
    gen, new = cache.since(tmp_path, 0)
    assert [r["step"] for r in new] == [1]
    half = line(2, **{"reward/mean": 0.2})
    with path.open("a") as f:
        f.write(half[:10])
    assert [r["step"] for r in cache.records(tmp_path)] == [0, 1]
    with path.open("a") as f:
        f.write(half[10:] + line(3, **{"reward/mean": None}))
    gen2, new = cache.since(tmp_path, 1)
    assert gen2 == gen and [r["step"] for r in new] == [2, 3]


def test_a_rewritten_file_is_read_again_under_a_new_generation(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(1, a=1) + line(2, a=2) + line(3, a=3))
    cache = MetricsCache()
    gen, _ = cache.since(tmp_path, -1)
    tmp = tmp_path / "metrics.jsonl.tmp"
    tmp.write_text(line(1, a=1))  # a resumed run purged the steps after its checkpoint
    os.replace(tmp, path)
    gen2, records = cache.since(tmp_path, -1)
    assert gen2 == gen + 1 and [r["step"] for r in records] == [1]


def test_payload_keeps_nulls_as_gaps_and_groups_by_prefix(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        line(1, **{"reward/mean": 0.5, "grad_norm": 2.0, "note": "text"}) + line(2, **{"reward/mean": None})
    )
    payload = metrics_payload(tmp_path, MetricsCache(), -1)
    assert payload["last_step"] == 2
    assert payload["series"]["reward/mean"] == {"step": [1, 2], "time": [2.0, 3.0], "value": [0.5, None]}
    assert payload["t0"] == 2.0 and payload["x_title"] == "iteration"
    assert payload["units"] == {"reward/mean": "reward", "grad_norm": "L2 norm"}
    assert "note" not in payload["series"]
    assert payload["groups"] == {"reward/mean": "reward", "grad_norm": "train"}
    assert metrics_payload(tmp_path, MetricsCache(), 2)["series"] == {}


def test_groups() -> None:
    names = ["loss/policy", "train/optimizer_steps", "entropy", "val/accuracy", "time/update", "custom/x"]
    assert [group_of(n) for n in names] == ["train", "train", "train", "val", "time", "custom"]


def sft_line(step: int, time: float, tokens: float) -> str:
    """An `ascent sft` record: the trainer's statistics, PPO's constants included."""
    stats = {
        "loss/policy": 4.0 / step,
        "sft/nll": 4.0 / step,
        "lr": 1e-3,
        "grad_norm": 2.0,
        "tokens": tokens,
        "approx_kl": 0.0,
        "clipfrac": 0.0,
        "ratio": 1.0,
        "loss/total": 4.0 / step,
    }
    return json.dumps({"step": step, "time": time, **stats}) + "\n"


def test_an_sft_run_gets_its_own_charts_and_a_derived_throughput(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        sft_line(1, 10.0, 80) + sft_line(2, 10.5, 100) + sft_line(3, 11.5, 50)
    )
    payload = metrics_payload(tmp_path, MetricsCache(), -1, kind="sft")
    assert not {"approx_kl", "clipfrac", "ratio", "loss/total"} & set(payload["series"])
    assert {"sft/nll", "lr", "grad_norm", "perf/tokens_per_s", "time/step"} <= set(payload["series"])
    assert payload["series"]["perf/tokens_per_s"] == {
        "step": [2, 3],
        "time": [10.5, 11.5],
        "value": [200.0, 50.0],
    }
    assert payload["series"]["time/step"]["value"] == [0.5, 1.0]
    assert payload["units"]["sft/nll"] == payload["units"]["loss/policy"] == "nats/token"
    assert payload["units"]["perf/tokens_per_s"] == "tokens/s" and payload["x_title"] == "optimizer step"
    newer = metrics_payload(tmp_path, MetricsCache(), 2, kind="sft")  # the rate of step 3 needs step 2's time
    assert newer["series"]["perf/tokens_per_s"]["value"] == [50.0] and newer["last_step"] == 3
    rl = metrics_payload(tmp_path, MetricsCache(), -1, kind="train")
    assert "approx_kl" in rl["series"] and "perf/tokens_per_s" not in rl["series"]
    assert rl["units"]["loss/policy"] == ""  # an RL surrogate loss has no unit


def test_units_of_common_metrics() -> None:
    expected = {
        "time/update": "s",
        "perf/tokens_per_s": "tokens/s",
        "val/accuracy": "fraction",
        "val/pass@4": "fraction",
        "val/source/gsm8k/pass@1": "fraction",
        "val/env/sql/mean@4": "reward",
        "val/source/gsm8k/accuracy": "fraction",
        "rollout/response_len_mean": "tokens",
        "entropy": "nats/token",
        "approx_kl": "nats",
        "rollout/staleness_max": "policy versions",
        "custom/thing": "",
    }
    assert {name: unit_of(name, "train") for name in expected} == expected
