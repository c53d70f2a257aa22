"""bench/fsdp_curve.py on CPU: one trainer rank and two FSDP2-sharded ranks (gloo, Ray), the same curve.

It starts from the session's SFT warm start (`warm_model`, the arithmetic data) through `--model`/`--data`
rather than its own SFT: what it compares is the two runs from one start, which needs only a reward that is
neither 0 nor 1 (checked below: a non-zero gradient)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.slow
def test_fsdp_curve_cpu_two_ranks_match_one(tmp_path, warm_model, arithmetic_data, ray_address):
    out = tmp_path / "curve.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "fsdp_curve.py"),
        "--device",
        "cpu",
        "--iterations",
        "3",
        "--workdir",
        str(tmp_path / "work"),
        "--out",
        str(out),
        "--model",
        str(warm_model),
        "--data",
        str(arithmetic_data),
        "--set",
        f"cluster.address={ray_address}",  # both runs join the module's cluster instead of starting one
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    cmp = report["comparison"]
    assert cmp["iterations_compared"] == 3
    assert cmp["rollout_diverged_at"] is None  # fp32 on CPU: the same samples in every iteration
    assert report["runs"]["b"]["trainer_ranks"] == 2
    assert max(report["runs"]["a"]["curve"]["grad_norm"]) > 0  # a real update, not an all-zero advantage
    for key in ("loss/policy", "loss/total", "grad_norm", "entropy", "rollout/logprob_diff_mean"):
        assert cmp["max_abs_diff"][key] < 1e-4, (key, cmp["max_abs_diff"][key])
    assert "max|a-b|" in proc.stdout


def test_the_bench_warm_start_command_is_a_valid_sft_config(tmp_path):
    """What the test above no longer runs (it brings its own warm start): the bench's own CPU `ascent sft`
    config, examples/arithmetic/sft.yaml with the preset's overrides, still validates."""
    import importlib.util

    from ascent.config import SFTConfig, load_config

    spec = importlib.util.spec_from_file_location("fsdp_curve", ROOT / "bench" / "fsdp_curve.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    preset = bench.PRESETS["cpu"]
    overrides = [
        f"run_dir={tmp_path / 'sft'}",
        f"model.path={tmp_path}",
        "data.train_path=x.jsonl",
        "data.val_path=null",
        *preset["sft"],
        *bench.compile_overrides("off"),
    ]
    cfg = load_config(bench.EXAMPLE / preset["sft_yaml"], overrides, SFTConfig)
    assert cfg.epochs == 40.0 and cfg.batch_size == 16
