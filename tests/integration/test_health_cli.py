"""`ascent train` watches the run's health: a diverging run stops before it saves a checkpoint over good
ones."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.integration.conftest import ascent_here, run_config, write_yaml

PARITY = "tests.integration.health_rewards:first_token_parity"  # mixed rewards: a real gradient at once


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.is_file()}


def test_a_diverging_run_stops_before_its_checkpoint(tmp_path: Path, tiny_model: Path, arithmetic_data: Path):
    """One sane iteration (checkpoint iter_000001), then a resume at train.lr=1e3 without clipping: the first
    update breaks the weights (the second mini-batch's gradient is not finite); the run exits 2 naming the
    metric, the iteration, the last good checkpoint and the fix, and leaves iter_000001 as it was."""
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    cfg["reward"] = {"fn": PARITY}
    cfg["checkpoint"] = {"every": 1}
    ascent_here("train", str(write_yaml(tmp_path / "sane.yaml", cfg)))
    good = tmp_path / "run" / "checkpoints" / "iter_000001"
    before = digest(good)
    cfg["iterations"] = 3
    cfg["train"] |= {"lr": 1e3, "max_grad_norm": None}
    wild = write_yaml(tmp_path / "wild.yaml", cfg)
    proc = ascent_here("train", str(wild), "--resume", "--accept-changes", check=False)
    assert proc.returncode == 2, proc.stderr
    for part in (
        "training diverged at iteration 2",
        "grad_norm=nan",
        str(good),
        "lower train.lr (now 1000.0)",
    ):
        assert part in proc.stderr, part
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in good.parent.iterdir()) == ["iter_000001"]
    assert digest(good) == before
