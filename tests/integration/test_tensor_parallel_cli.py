"""`ascent train` with rollout.tensor_parallel=2 (inline, CPU): the replica's worker forks its second rank,
and the sharded engine samples what the unsharded trainer scores, through sleeps, releases and publications."""

from __future__ import annotations

import json

from conftest import ascent, run_config, write_yaml


def test_train_with_a_tensor_parallel_replica(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=2, val_every=0)
    cfg["rollout"] |= {"engine": "fast", "tensor_parallel": 2}
    cfg["cluster"] = {"device": "cpu", "placement": "colocated"}
    cfg["checkpoint"] = {"every": 0}
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [x for x in map(json.loads, lines) if "reward/mean" in x]
    assert [x["step"] for x in steps] == [1, 2]
    assert all(x["rollout/logprob_diff_max"] < 1e-3 for x in steps)
