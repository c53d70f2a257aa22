"""`ascent train` with rollout.quantization=fp8 (fast engine, CPU emulation): the run completes, and the
sampler/trainer gap and the TIS correction's weights are logged; the gap is FP8's, not fp32 rounding's."""

from __future__ import annotations

import json

from conftest import ascent, run_config, write_yaml


def test_train_with_fp8_rollout_logs_the_gap_and_the_correction(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    cfg["rollout"] |= {"engine": "fast", "quantization": "fp8"}
    cfg["algorithm"] = {"rollout_correction": "tis", "rollout_correction_threshold": 2.0}
    cfg["cluster"] = {"device": "cpu"}
    cfg["checkpoint"] = {"every": 0}
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [x for x in map(json.loads, lines) if "reward/mean" in x]
    assert [x["step"] for x in steps] == [1]
    x = steps[0]
    # an fp32 engine agrees with the trainer to ~1e-6 here (test_tensor_parallel_cli.py: < 1e-3 at most)
    assert 1e-4 < x["rollout/logprob_diff_mean"] <= x["rollout/logprob_diff_max"] < 0.5
    assert abs(x["rollout_is_weight_mean"] - 1) < 0.1 and x["rollout_is_clipped_frac"] == 0.0
