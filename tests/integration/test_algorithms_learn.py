"""Each advantage estimator and policy loss raises the reward of a warm-started tiny model on 1-digit addition.

One SFT warm-start is shared by the session; every variant then runs a short `ascent train` through the real
CLI and must end with a higher training reward than it started with (means over the first and last
iterations, fixed seeds, so the comparison is deterministic on a given machine).
"""

from __future__ import annotations

import json

import pytest
from conftest import ascent, write_yaml

VARIANTS = {
    "grpo+ppo": {"algorithm": {"advantage": "grpo", "policy_loss": "ppo"}},
    "rloo": {"algorithm": {"advantage": "rloo"}},
    "reinforce_pp": {"algorithm": {"advantage": "reinforce_pp"}},
    "gae+critic": {"algorithm": {"advantage": "gae", "critic_lr": 1e-3, "lam": 0.95}},
    "grpo+gspo": {"algorithm": {"advantage": "grpo", "policy_loss": "gspo"}},
    "grpo+cispo": {"algorithm": {"advantage": "grpo", "policy_loss": "cispo"}},
}
ITERATIONS, WINDOW = 14, 4


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory, tiny_model, arithmetic_data):
    """The tiny model after a short SFT on 1-digit sums: some answers right, many wrong."""
    root = tmp_path_factory.mktemp("warm")
    cfg = {
        "run_dir": str(root / "sft"),
        "epochs": 12.0,
        "batch_size": 8,
        "model": {"path": str(tiny_model)},
        "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 256},
        "tracking": {"progress": False, "tensorboard": False},
    }
    ascent("sft", str(write_yaml(root / "sft.yaml", cfg)))
    return root / "sft" / "final"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_improves_reward(name, tmp_path, warm_model, arithmetic_data):
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "seed": 1,
        "iterations": ITERATIONS,
        "model": {"path": str(warm_model)},
        "data": {"train_path": str(arithmetic_data / "train.jsonl"), "max_prompt_tokens": 32},
        "rollout": {"prompts_per_step": 8, "samples_per_prompt": 8, "max_new_tokens": 4},
        "train": {"lr": 2e-3, "trajectories_per_update": 32, "max_tokens_per_micro_batch": 1024},
        "tracking": {"progress": False, "tensorboard": False, "trace": False},
    }
    for section, values in VARIANTS[name].items():
        cfg.setdefault(section, {}).update(values)
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert last > first + 0.1, f"{name}: reward {first:.3f} -> {last:.3f} ({[round(r, 2) for r in rewards]})"
