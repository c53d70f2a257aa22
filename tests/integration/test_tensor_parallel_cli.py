"""`ascent train` with rollout.tensor_parallel=2 (inline, CPU) on a tiny Qwen3-MoE: the replica's worker forks
its second rank, and the sharded engine (attention heads and every expert split over the ranks, the router
replicated) samples what the unsharded trainer scores, replaying the experts the engine recorded, through
sleeps, releases and publications of the trainer's stacked experts. (A dense model's sharding takes the same
path; tests/unit/rollout_fast/test_fast_tensor_parallel.py compares it with one process.)"""

from __future__ import annotations

import json

from conftest import ascent, run_config, write_yaml

from ascent.models.tiny import make_tiny_moe_checkpoint


def test_train_with_a_tensor_parallel_replica(tmp_path, arithmetic_data):
    moe = make_tiny_moe_checkpoint(
        tmp_path / "moe", hidden_size=32, num_layers=1, num_experts=4, moe_intermediate_size=16
    )
    cfg = run_config(tmp_path, moe, arithmetic_data, iterations=2, val_every=0)
    cfg["rollout"] |= {"engine": "fast", "tensor_parallel": 2}
    cfg["cluster"] = {"device": "cpu", "placement": "colocated"}
    cfg["checkpoint"] = {"every": 0}
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [x for x in map(json.loads, lines) if "reward/mean" in x]
    assert [x["step"] for x in steps] == [1, 2]
    assert all(x["rollout/logprob_diff_max"] < 1e-3 for x in steps)
