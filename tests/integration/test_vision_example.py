"""examples/vision/run_comparison.py end to end at its smallest: the zoom task's setup, the two-stage warm
start (stage 1, shared: the pattern word alone, through `weight: 0` on the zoom call and
`turn_end_loss: false`; stage 2, per arm: the whole demonstrations, with the tool zooming into a random
quarter), and one GRPO iteration of each arm (zoom_qa with
the tool, image_qa without) through the real CLI on a tiny Qwen2.5-VL checkpoint. The learning comparison
itself (3 seeds, margins) takes minutes on CPU, over the suite's budget: its numbers are in
examples/vision/README.md."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_vision_comparison_runs_both_arms_and_prints_the_table(tmp_path: Path) -> None:
    script = ROOT / "examples" / "vision" / "run_comparison.py"
    args = ["--root", str(tmp_path), "--seeds", "1", "--iterations", "1", "--read-epochs", "1"]
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            *args,
            "--format-epochs",
            "1",
            "--rows",
            "8",
            "--format-rows",
            "4",
            "--val",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = re.search(r"^\s+1 \| +([\d.]+) -> ([\d.]+) +\| +([\d.]+) -> ([\d.]+)", proc.stdout, re.M)
    assert row, proc.stdout
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
    boxes = _gpu_run().BOXES
    (asked,) = {q for q in boxes if q in json.dumps(places[0][1])}  # the user turn's question
    zoomed = [q for m in places for q in boxes if boxes[q] in m[-1]["content"]]
    assert sorted(zoomed) == sorted([asked, *boxes]), zoomed  # the asked quarter twice, the others once


def _gpu_run():
    spec = importlib.util.spec_from_file_location("gpu_run", ROOT / "examples" / "vision" / "gpu_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_run_scores_where_each_sampled_episode_zoomed(tmp_path: Path) -> None:
    """gpu_run.py's right-zoom windows, from a run's experience store: an episode zoomed right when its call
    names the asked quarter's box; `reading` is the reward of those."""
    conn = sqlite3.connect(tmp_path / "experience.db")
    conn.execute("CREATE TABLE episodes (iteration, prompt_text, response_text, reward)")
    ask = "What pattern fills the framed square in the {} quarter of the image?"
    call = '<tool_call>{{"name": "zoom_in", "arguments": {{"bbox": [{}]}}}}</tool_call>'
    rows = [
        (1, ask.format("top-left"), call.format("0.0, 0.0, 0.5, 0.5"), 1.0),  # right, read
        (1, ask.format("top-right"), call.format("0.0, 0.0, 0.5, 0.5"), 0.0),  # wrong quarter
        (2, ask.format("bottom-right"), call.format("0.5, 0.5, 1.0, 1.0"), 0.0),  # right, misread
        (3, ask.format("bottom-left"), call.format("0.0, 0.5, 0.5, 1.0"), 1.0),  # right, read
    ]
    conn.executemany("INSERT INTO episodes VALUES (?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    first, second = _gpu_run().right_zoom_windows(tmp_path, window=2)
    assert first == {
        "iterations": [1, 2],
        "episodes": 3,
        "right_zoom": 0.667,
        "reward": 0.333,
        "reading": 0.5,
    }
    assert second == {"iterations": [3, 4], "episodes": 1, "right_zoom": 1.0, "reward": 1.0, "reading": 1.0}


def test_gpu_run_passes_overrides_to_the_stage_they_name(tmp_path: Path) -> None:
    """Positional overrides reach both stages, --sft-set / --grpo-set one; the arm without the tool takes
    the recipe's word grammar on image_qa; the flags' rates land in train.lr."""
    g = _gpu_run()
    a = g.parse(
        [
            "--root",
            str(tmp_path),
            "--lr",
            "2e-5",
            "--kl",
            "0.01",
            "--sft-set",
            "epochs=2",
            "--grpo-set",
            "x=1",
            "--",
            "y=2",
        ]
    )
    sft = g.sft_command(a, tmp_path / "sft")
    plain = g.grpo_command(a, tmp_path / "run", tmp_path / "start", "plain", 1)
    assert {"train.lr=0.00015", "epochs=2", "y=2", "model.dtype=bf16"} <= set(sft) and "x=1" not in sft
    assert {"train.lr=2e-05", "algorithm.kl_loss_coef=0.01", "x=1", "y=2"} <= set(
        plain
    ) and "epochs=2" not in plain
    assert "rollout.source.env=image_qa" in plain
    (grammar,) = json.loads(next(x for x in plain if x.startswith("rollout.grammar=")).split("=", 1)[1])
    assert "WORD" in grammar and "tool_call" not in grammar
