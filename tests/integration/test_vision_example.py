"""examples/vision/run_comparison.py end to end at its smallest: the zoom task's setup, the two-stage warm
start (stage 1, shared: the pattern word alone, through `weight: 0` on the zoom call and
`turn_end_loss: false`; stage 2, per arm: the whole demonstrations, with the tool zooming into a random
quarter), and one GRPO iteration of each arm (zoom_qa with
the tool, image_qa without) through the real CLI on a tiny Qwen2.5-VL checkpoint. The learning comparison
itself (3 seeds, margins) takes minutes on CPU, over the suite's budget: its numbers are in
examples/vision/README.md."""

from __future__ import annotations

import json
import os
import re
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
