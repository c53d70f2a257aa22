"""The resolved config: dump in schema order, write to the run directory, read back unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from ascent.config import RunConfig, SFTConfig, dump_config, load_config, write_resolved_config
from ascent.config.explain import explain_sections


def test_dump_follows_the_schema_order() -> None:
    text = dump_config(RunConfig())
    top = [line.split(":")[0] for line in text.splitlines() if line and not line.startswith(" ")]
    assert top == list(RunConfig.model_fields)
    assert "  lora:\n    rank: 0" in text
    assert "stop_token_ids: []" in text and "betas: [0.9, 0.999]" in text


def test_round_trip_through_the_run_dir(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            "run_dir=runs/2024",
            "train.lr=1e-5",
            "train.max_grad_norm=.inf",
            "rollout.stop_token_ids=[1,2]",
            "rollout.stop_strings=['</answer>', 'yes', '1e-5', 'null']",
            "reward.kwargs={a: [1, {b: 2}], s: 'on', n: null}",
            "tracking.wandb_project=1e-5",
            "data.val_path=null",
        ],
    )
    path = write_resolved_config(cfg, tmp_path / "run")
    assert path == tmp_path / "run" / "config.yaml"
    again = load_config(path, [])
    assert again == cfg
    assert math.isinf(again.train.max_grad_norm)
    assert again.tracking.wandb_project == "1e-5"
    assert yaml.safe_load(path.read_text())["train"]["lr"] == 1e-5  # plain YAML tools read it right too


def test_sft_round_trip(tmp_path: Path) -> None:
    cfg = load_config(None, ["epochs=0.5", "train.lr=2e-5"], SFTConfig)
    assert load_config(write_resolved_config(cfg, tmp_path), [], SFTConfig) == cfg


def test_rewrite_replaces_the_file(tmp_path: Path) -> None:
    write_resolved_config(RunConfig(), tmp_path)
    write_resolved_config(load_config(None, ["seed=7"]), tmp_path)
    assert load_config(tmp_path / "config.yaml", []).seed == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_explain_rows_cover_every_field_with_defaults() -> None:
    cfg = load_config(None, ["train.lr=1e-5", "model.lora.rank=8"])
    sections = explain_sections(cfg)
    assert list(sections)[:3] == ["run", "model", "data"]
    lr = next(r for r in sections["train"] if r.name == "lr")
    assert (lr.value, lr.default, lr.changed) == (1e-5, 1e-6, True)
    assert lr.description == "Peak learning rate of AdamW."
    rank = next(r for r in sections["model"] if r.name == "lora.rank")
    assert rank.changed and rank.default == 0
    sft_lr = next(r for r in explain_sections(SFTConfig())["train"] if r.name == "lr")
    assert sft_lr.default == 1e-4 and not sft_lr.changed  # the SFT schema's own default
