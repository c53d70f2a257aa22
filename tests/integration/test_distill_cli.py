"""On-policy distillation through `ascent train`: the trainer holds a frozen teacher (a tiny checkpoint of
another seed, the student's tokenizer), scores every sampled token with it, and the run logs
`distill/reverse_kl` each iteration."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ascent.models.tiny import make_tiny_checkpoint
from tests.integration.conftest import ascent_here, run_config, write_yaml


def test_distillation_trains_and_logs_the_reverse_kl(tmp_path: Path, tiny_model: Path, arithmetic_data: Path):
    teacher = make_tiny_checkpoint(tmp_path / "teacher", hidden_size=32, num_layers=2, seed=1)
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=2, val_every=0)
    cfg["data"].pop("val_path")
    cfg["algorithm"] = {"advantage": "distill", "teacher": str(teacher)}
    cfg["tracking"] |= {"tensorboard": False, "trace": False}
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kls = [m["distill/reverse_kl"] for m in metrics if "distill/reverse_kl" in m]
    assert len(kls) == 2 and all(math.isfinite(k) for k in kls)
    assert any(k != 0.0 for k in kls)  # two different random models disagree on the sampled tokens
