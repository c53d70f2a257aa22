"""examples/vision/run_comparison.py end to end at its smallest: the zoom task's setup, one SFT epoch on 8
demonstrations per arm, and one GRPO iteration of each arm (zoom_qa with the tool, image_qa without) through the real
CLI on a tiny Qwen2.5-VL checkpoint. The learning comparison itself (3 seeds, margins) is too slow for CI on
CPU; its numbers are in examples/vision/README.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_vision_comparison_runs_both_arms_and_prints_the_table(tmp_path: Path) -> None:
    script = ROOT / "examples" / "vision" / "run_comparison.py"
    args = ["--root", str(tmp_path), "--seeds", "1", "--iterations", "1", "--sft-epochs", "1"]
    proc = subprocess.run(
        [sys.executable, str(script), *args, "--rows", "8", "--val", "4"],
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
    for arm in ("zoom", "plain"):  # each arm's own warm start, from the same checkpoint
        assert (tmp_path / f"sft_{arm}" / "final" / "preprocessor_config.json").is_file()
