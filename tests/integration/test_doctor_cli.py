"""`ascent doctor` as a user runs it: the real CLI in a subprocess on a tiny model's config."""

from __future__ import annotations

import json

from tests.integration.conftest import ascent_here, run_config, write_yaml


def test_doctor_passes_a_tiny_cpu_config_and_prints_json(tmp_path, tiny_model, arithmetic_data):
    path = write_yaml(tmp_path / "run.yaml", run_config(tmp_path, tiny_model, arithmetic_data))
    proc = ascent_here("doctor", str(path), "cluster.device=cpu", "--json", "--gpu-memory", "80")
    out = json.loads(proc.stdout)
    by_name = {c["name"]: c for c in out["checks"]}
    assert out["counts"]["fail"] == 0
    assert by_name["model"]["status"] == "ok" and by_name["tokenizer"]["status"] == "ok"
    assert by_name["memory per GPU"]["data"]["peak_bytes"] > 0
    host = by_name["host memory (CPU run)"]  # the workers run on the CPU: the run's RAM, whatever the GPU
    assert host["data"]["needed_bytes"] > host["data"]["phases"]["update"]["weights"] > 0
    assert by_name["data: train"]["status"] == by_name["data: val"]["status"] == "ok"


def test_doctor_fails_on_missing_data_and_model_without_asking_the_hub(tmp_path):
    proc = ascent_here(
        "doctor",
        f"model.path={tmp_path / 'no_model'}",
        f"data.train_path={tmp_path / 'no.jsonl'}",
        "cluster.device=cpu",
        "--json",
        check=False,
    )
    by_name = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert proc.returncode == 1, proc.stderr
    assert (
        by_name["data: train"]["status"] == "fail"
        and "no.jsonl' does not exist" in by_name["data: train"]["detail"]
    )
    for check in ("model", "tokenizer"):
        assert by_name[check]["status"] == "fail" and "no such directory" in by_name[check]["detail"]
    assert "hub" not in proc.stdout.lower().replace("never downloads from the hub", "")


def test_doctor_exits_1_on_a_failed_check_and_2_on_a_bad_config(tmp_path, tiny_model, arithmetic_data):
    path = write_yaml(tmp_path / "run.yaml", run_config(tmp_path, tiny_model, arithmetic_data))
    tight = ascent_here(
        "doctor",
        str(path),
        "train.max_tokens_per_micro_batch=100000",
        "data.max_prompt_tokens=30000",
        "--gpu-memory",
        "0.01",
        check=False,
    )
    assert tight.returncode == 1, tight.stdout + tight.stderr
    assert "memory per GPU" in tight.stdout and "fail" in tight.stdout
    bad = ascent_here("doctor", str(path), "train.lr=-1", check=False)
    assert bad.returncode == 2 and "train.lr" in bad.stderr
