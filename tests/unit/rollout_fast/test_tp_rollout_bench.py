"""bench/tp_rollout.py on its tiny shape at TP=1, in this process on CPU: the meta model's weights are made
random where the engine builds them, the workload generates every token (EOS off) and the report holds the
numbers. (TP=2 spawns processes, which cost seconds each: run by hand, as the bench's docstring shows.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[3] / "bench" / "tp_rollout.py"


def test_tiny_shape_runs_at_tp1_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("tp_rollout_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = "--shape tiny --device cpu --tp 1 --prompts 2 --samples 2 --prompt-len 8 --new-tokens 4"
    res = module.main([*argv.split(), "--max-batch-size", "4", "--json", str(tmp_path / "r.json")])
    tp1 = res["tp"][1]
    assert tp1["new_tokens"] == 2 * 2 * 4 and tp1["steps"] >= 3
    assert tp1["roofline"]["weight_gb"] > 0 and tp1["ranks"][0]["kv_cache"] > 0
    assert (tmp_path / "r.json").is_file()
    # the random weights are made from their names: the same on every build (every rank), not all equal
    model = module.meta_model("tiny")
    name = "model.layers.0.mlp.up_proj.weight"
    meta = dict(model.named_parameters())[name]
    a, b = (module._random(name, meta, torch.float32, torch.device("cpu")) for _ in range(2))
    assert torch.equal(a, b) and a.std() > 0.01
