"""examples/vision/run_comparison.py end to end at its smallest: the zoom task's setup, the two-stage warm
start (stage 1, shared: the pattern word alone, through `weight: 0` on the zoom call and
`turn_end_loss: false`; stage 2, per arm: the whole demonstrations, with the tool zooming into a random
quarter), and one GRPO iteration of each arm (zoom_qa with
the tool, image_qa without) through the real CLI on a tiny Qwen2.5-VL checkpoint. The learning comparison
itself (3 seeds, margins) takes minutes on CPU, over the suite's budget: its numbers are in
examples/vision/README.md."""

from __future__ import annotations

import importlib
import json
import math
import re
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_vision_comparison_runs_both_arms_and_prints_the_table(
    tmp_path: Path, vision_comparison: Callable[..., str]
) -> None:
    args = ["--root", str(tmp_path), "--seeds", "1", "--iterations", "1", "--read-epochs", "1"]
    out = vision_comparison(*args, "--format-epochs", "1", "--rows", "8", "--format-rows", "4", "--val", "4")
    row = re.search(r"^\s+1 \| +([\d.]+) -> ([\d.]+) +\| +([\d.]+) -> ([\d.]+)", out, re.M)
    assert row, out
    assert all(0.0 <= float(x) <= 1.0 for x in row.groups())
    for arm in ("zoom", "plain"):  # each arm trained one iteration and saved its policy
        assert (tmp_path / f"grpo_{arm}_1" / "checkpoints" / "iter_000001").is_dir()
        assert (tmp_path / f"sft_{arm}" / "final" / "preprocessor_config.json").is_file()
    # stage 1 trains one token per conversation (the pattern word: the call at weight 0, no turn end);
    # stage 2 the whole model turns: the zoom call, the answer and their turn ends
    (read,) = metrics(tmp_path / "sft_read")  # once, shared by both arms
    (full,) = metrics(tmp_path / "sft_zoom")
    assert read["response_tokens"] == 16.0  # a batch of 16 conversations (sft_read.yaml), one token each
    assert full["response_tokens"] == 16 * (6 + 4)  # the call's 5 tokens, the answer's 3, two turn ends
    # --spread's stage 2 (make_setup.write_spread): per question 5 rows ending in the zoom call, 2 of them
    # into the asked quarter, 1 into each other quarter; and as many reading rows (the word alone)
    spread = [json.loads(line) for line in (tmp_path / "zoom" / "spread.jsonl").read_text().splitlines()]
    places = [r["messages"] for r in spread if "<tool_call>" in r["messages"][-1]["content"]]
    assert len(places) == 5 and len(spread) == 10
    _gpu_run()  # (puts examples/vision on sys.path)
    boxes = importlib.import_module("make_setup").BOXES
    assert boxes == importlib.import_module("run_watch").BOXES  # gpu_run.py scores zooms where the data zooms
    (asked,) = {q for q in boxes if q in json.dumps(places[0][1])}  # the user turn's question
    zoomed = [q for m in places for q in boxes if boxes[q] in m[-1]["content"]]
    assert sorted(zoomed) == sorted([asked, *boxes]), zoomed  # the asked quarter twice, the others once


def _gpu_run():
    vision = str(ROOT / "examples" / "vision")
    if vision not in sys.path:  # gpu_run.py imports run_watch.py from beside it, as its script run does
        sys.path.insert(0, vision)
    return importlib.import_module("gpu_run")


def test_gpu_run_scores_where_each_sampled_episode_zoomed(tmp_path: Path) -> None:
    """gpu_run.py's right-zoom windows, from a run's experience store: an episode zoomed right when its call
    names the asked quarter's box; `reading` is the reward of those."""
    conn = sqlite3.connect(tmp_path / "experience.db")
    conn.execute("CREATE TABLE episodes (iteration, prompt_text, response_text, reward, turns)")
    ask = "What pattern fills the framed square in the {} quarter of the image?"
    call = '<tool_call>{{"name": "zoom_in", "arguments": {{"bbox": [{}]}}}}</tool_call>'
    rows = [
        (1, ask.format("top-left"), call.format("0.0, 0.0, 0.5, 0.5"), 1.0, 2),  # right, read
        (1, ask.format("top-right"), call.format("0.0, 0.0, 0.5, 0.5"), 0.0, 2),  # wrong quarter
        (2, ask.format("bottom-right"), call.format("0.5, 0.5, 1.0, 1.0"), 0.0, 2),  # right, misread
        (3, ask.format("bottom-left"), call.format("0.0, 0.5, 0.5, 1.0"), 1.0, 3),  # right, read
    ]
    conn.executemany("INSERT INTO episodes VALUES (?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    g = _gpu_run()
    first, second = g.right_zoom_windows(tmp_path, window=2)
    assert first == {
        "iterations": [1, 2],
        "episodes": 3,
        "right_zoom": 0.667,
        "reward": 0.333,
        "reading": 0.5,
    }
    assert second == {"iterations": [3, 4], "episodes": 1, "right_zoom": 1.0, "reward": 1.0, "reading": 1.0}
    # one image a model turn (the question's, then each zoom's): 9 images, 4 episodes over 3 + 1 seconds
    done = [
        {"step": 1, "time/iteration": 3.0},
        {"step": 2, "time/iteration": 1.0},
        {"step": 2, "val/accuracy": 0.5},
    ]
    assert g.throughput(tmp_path, done) == {
        "seconds_per_iteration": 2.0,
        "episodes_per_s": 1.0,
        "images_per_s": 2.25,
    }


def test_gpu_run_passes_overrides_to_the_stage_they_name(tmp_path: Path) -> None:
    """Positional overrides reach every stage, --sft-set / --place-set / --grpo-set one; the arm without the
    tool takes the recipe's word grammar on image_qa; the flags' rates land in train.lr, one per arm."""
    g = _gpu_run()
    a = g.parse(
        ["--root", str(tmp_path), "--place", "--arms", "zoom,plain", "--lrs", "2e-5,1e-5", "--kl", "0.01"]
        + ["--sft-set", "epochs=2", "--place-set", "z=3", "--grpo-set", "x=1", "--", "y=2"]
    )
    sft = g.sft_command(a, tmp_path / "sft", "1", tmp_path / "model", epochs=0.5)
    place = g.sft_command(a, tmp_path / "sft", "2", tmp_path / "sft" / "final", epochs=0.5)
    zoom, plain = (g.grpo_command(a, tmp_path / "run", tmp_path / "start", run) for run in a.runs)
    assert {"train.lr=0.00015", "epochs=2", "y=2", "model.dtype=bf16"} <= set(sft) and "x=1" not in sft
    assert "z=3" in place and "z=3" not in sft and str(tmp_path / "zoom" / "place.jsonl") in place[4]
    assert str(tmp_path / "zoom" / "read_plastic.jsonl") in sft[4]
    assert {"train.lr=2e-05", "algorithm.kl_loss_coef=0.01", "x=1", "y=2"} <= set(
        zoom
    ) and "epochs=2" not in zoom
    assert "train.lr=1e-05" in plain and "rollout.source.env=image_qa" in plain
    assert zoom[1].endswith("grpo_place.yaml") and "iterations=20" in zoom
    assert f"data.train_path={tmp_path / 'zoom' / 'rows_first256.jsonl'}" in zoom  # (--grpo-rows 256)
    (grammar,) = json.loads(next(x for x in plain if x.startswith("rollout.grammar=")).split("=", 1)[1])
    assert "WORD" in grammar and "tool_call" not in grammar


def test_gpu_run_asks_for_the_steps_it_names(tmp_path: Path) -> None:
    """A stage's `epochs` gives exactly its --*-steps optimizer steps (the SFT entrypoint's ceiling)."""
    g = _gpu_run()
    for rows in (2176, 2048, 64, 7):
        data = tmp_path / "rows.jsonl"
        data.write_text("{}\n" * rows)
        for steps in (1, 4, 24, 96, 300):
            epochs = g.epochs_for(steps, "sft_read.yaml", data)
            assert math.ceil(epochs * rows / 16) == steps
