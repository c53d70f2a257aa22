"""`ascent doctor` as a user runs it: the real CLI in a subprocess on a tiny model's config."""

from __future__ import annotations

import json

from tests.integration.conftest import ascent, run_config, write_yaml


def test_doctor_passes_a_tiny_cpu_config_and_prints_json(tmp_path, tiny_model, arithmetic_data):
    path = write_yaml(tmp_path / "run.yaml", run_config(tmp_path, tiny_model, arithmetic_data))
    proc = ascent("doctor", str(path), "cluster.device=cpu", "--json", "--gpu-memory", "80")
    out = json.loads(proc.stdout)
    by_name = {c["name"]: c for c in out["checks"]}
    assert out["counts"]["fail"] == 0
    assert by_name["model"]["status"] == "ok" and by_name["tokenizer"]["status"] == "ok"
    assert by_name["memory per GPU"]["data"]["peak_bytes"] > 0


def test_doctor_exits_1_on_a_failed_check_and_2_on_a_bad_config(tmp_path, tiny_model, arithmetic_data):
    path = write_yaml(tmp_path / "run.yaml", run_config(tmp_path, tiny_model, arithmetic_data))
    tight = ascent("doctor", str(path), "train.max_tokens_per_micro_batch=100000", "data.max_prompt_tokens=30000",
                   "--gpu-memory", "0.01", check=False)  # fmt: skip
    assert tight.returncode == 1, tight.stdout + tight.stderr
    assert "memory per GPU" in tight.stdout and "fail" in tight.stdout
    bad = ascent("doctor", str(path), "train.lr=-1", check=False)
    assert bad.returncode == 2 and "train.lr" in bad.stderr
