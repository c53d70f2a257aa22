"""bench/gemm_sweep.py and bench/rollout.py --fused-gemm on CPU: they import and parse their arguments (the
GPU runs them), the sweep's candidate tiles suit each shape, and its table prints as `TILES` entries that
`pick_tile` then reads."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from ascent.rollout.fast import fused_gemm
from ascent.rollout.fast.fused_gemm import SMEM_BYTES, Tile, pick_tile

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_parses_picks_candidates_and_prints_tiles(monkeypatch):
    sweep = _load("gemm_sweep")
    args = sweep.parse(["--shapes", "0.5b,7b", "--rows", "64,256", "--budget-s", "30"])
    assert (args.shapes, args.rows, args.budget_s) == (["0.5b", "7b"], [64, 256], 30.0)
    with pytest.raises(SystemExit):
        sweep.parse(["--shapes", "9b"])
    cpu = torch.device("cpu")
    for op, n, k in (("gate_up", 9728, 896), ("residual", 896, 4864), ("qkv_rope", 1152, 896)):
        accs = 1 if op == "residual" else 2
        tiles = sweep.candidates(op, 64, n, k, 132, cpu)
        assert len(tiles) >= 8 and all(t.block_m <= 128 for t in tiles)
        assert all(
            t.num_stages * (t.block_m + accs * t.block_n) * t.block_k * 2 <= SMEM_BYTES + 32768 for t in tiles
        )
    best = (64, 32, 128, 8, 4, 4)
    rows = [dict(op="residual", n=896, k=4864, rows=r, best=best) for r in (64, 128)]
    literal = sweep.tiles_literal(rows, "cpu")
    table: dict = {}
    monkeypatch.setattr(fused_gemm, "TILES", table)
    exec(literal, {"TILES": table})
    assert pick_tile("residual", 100, 896, 4864, cpu, 132) == Tile(*best)
    assert pick_tile("residual", 5, 896, 4864, cpu, 132).block_m == 16  # no taller than the rows need


def test_rollout_bench_fused_gemm_switch(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # rollout.py imports step_profile beside it
    rollout = _load("rollout")
    assert rollout.parse(["--fused-gemm", "on,off"]).fused_gemm == ["on", "off"]
    assert rollout.parse([]).fused_gemm is None
    with pytest.raises(SystemExit):
        rollout.parse(["--fused-gemm", "maybe"])
    monkeypatch.setenv("ASCENT_FAST_ENGINE", json.dumps({"compile": False}))
    with rollout.fused_gemm_override("off"):
        assert json.loads(os.environ["ASCENT_FAST_ENGINE"]) == {"compile": False, "fused_gemm": False}
    assert json.loads(os.environ["ASCENT_FAST_ENGINE"]) == {"compile": False}
    assert "step_profile" in sys.modules
