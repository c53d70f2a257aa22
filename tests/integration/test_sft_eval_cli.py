"""`ascent sft` lowers the response NLL and writes an HF checkpoint that `ascent eval` and `train` read."""

from __future__ import annotations

import json

from conftest import ascent, write_yaml


def test_sft_then_eval(tmp_path, tiny_model, arithmetic_data):
    cfg = {
        "run_dir": str(tmp_path / "sft"),
        "epochs": 3.0,
        "batch_size": 8,
        "model": {"path": str(tiny_model)},
        "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 128},
        "tracking": {"progress": False},
    }
    ascent("sft", str(write_yaml(tmp_path / "sft.yaml", cfg)))
    lines = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["sft/nll"] < lines[0]["sft/nll"]
    final = tmp_path / "sft" / "final"
    assert (final / "model.safetensors").exists() and (final / "tokenizer.json").exists()
    out = tmp_path / "responses.jsonl"
    proc = ascent(
        "eval",
        "--model",
        str(final),
        "--data",
        str(arithmetic_data / "val.jsonl"),
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
    )
    assert "accuracy" in proc.stdout
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 16 and all(r["reward"] in (0.0, 1.0) for r in rows)
