"""bench/memory_estimate.py on the tiny shape, on this machine (CPU: the estimate and the process's RSS)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[3] / "bench" / "memory_estimate.py"


@pytest.fixture
def registries():
    """The e2e bench registers its reward in this process: later tests see the built-ins only."""
    from ascent.rewards.registry import REWARD_FUNCTIONS

    before = dict(REWARD_FUNCTIONS)
    yield
    REWARD_FUNCTIONS.clear()
    REWARD_FUNCTIONS.update(before)


def test_memory_estimate_runs_an_iteration_of_the_tiny_e2e_config(tmp_path, registries):
    spec = importlib.util.spec_from_file_location("memory_estimate_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "res.json"
    res = module.main(
        [
            "--shape",
            "tiny",
            "--prompts",
            "2",
            "--samples",
            "2",
            "--prompt-len",
            "8",
            "--new-tokens",
            "4",
            "--micro-batch-tokens",
            "64",
            "--iterations",
            "1",
            "--json",
            str(out),
        ]
    )
    assert out.is_file()
    assert res["estimate_peak_phase"] in res["estimate_gib"] and res["estimate_peak_gib"] > 0
    assert set(res["estimate_gib"]) >= {"rollout", "update"}
    if torch.cuda.is_available():
        assert res["measured_peak_allocated_gib"] > 0 and res["ratio_allocated"] > 0
    else:
        assert res["note"] == "no CUDA: estimate only" and res["cpu_peak_rss_gib"] > 0
