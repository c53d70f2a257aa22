"""Bad input exits non-zero with one readable message that names the field or the row, not a traceback."""

from __future__ import annotations

from conftest import ascent, run_config, write_yaml


def test_bad_config_value_names_the_field(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data)
    cfg["rollout"]["samples_per_prompt"] = 1
    proc = ascent("train", str(write_yaml(tmp_path / "r.yaml", cfg)), check=False)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "rollout.samples_per_prompt=1" in out and "Traceback" not in out


def test_unknown_key_is_reported(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data)
    proc = ascent(
        "train", str(write_yaml(tmp_path / "r.yaml", cfg)), "rollout.samples_per_promt=4", check=False
    )
    assert proc.returncode == 2
    assert "samples_per_prompt" in proc.stdout + proc.stderr


def test_malformed_dataset_names_the_row(tmp_path, tiny_model, arithmetic_data):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "", "answer": "3"}\n')
    cfg = run_config(tmp_path, tiny_model, arithmetic_data)
    cfg["data"]["train_path"] = str(bad)
    proc = ascent("train", str(write_yaml(tmp_path / "r.yaml", cfg)), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "row 2" in out and "prompt" in out and "Traceback" not in out


def test_missing_model_dir(tmp_path, arithmetic_data):
    cfg = run_config(tmp_path, tmp_path / "nope", arithmetic_data)
    proc = ascent("train", str(write_yaml(tmp_path / "r.yaml", cfg)), check=False)
    assert proc.returncode == 2
    assert "nope" in proc.stdout + proc.stderr
