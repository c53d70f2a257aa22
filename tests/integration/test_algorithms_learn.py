"""Each advantage estimator and policy loss raises the reward of a warm-started tiny model on 1-digit addition.

One SFT warm-start is shared by the session; every variant then runs a short `ascent train` through the real
CLI on a fixed set of 8 prompts (the same prompts every iteration, so the reward curve is not dominated by
which prompts were drawn) and must end with a clearly higher training reward than it started with (means
over the first and last iterations; fixed seeds make the comparison deterministic on a given machine).
"""

from __future__ import annotations

import json

import pytest
from conftest import ascent, write_yaml

VARIANTS = {
    "grpo+ppo": {"algorithm": {"advantage": "grpo", "policy_loss": "ppo"}},
    "rloo": {"algorithm": {"advantage": "rloo"}},
    "reinforce_pp+kl_penalty": {"algorithm": {"advantage": "reinforce_pp", "kl_penalty_coef": 0.05}},
    "remax": {"algorithm": {"advantage": "remax"}},
    "dapo": {
        "algorithm": {
            "advantage": "grpo",
            "clip_ratio_high": 0.28,
            "dynamic_sampling": True,
            "overlong_buffer": 1,
            "loss_aggregation": "token-mean",
        }
    },
    "gae+critic": {"algorithm": {"advantage": "gae", "critic_lr": 1e-3, "lam": 0.95}},
    "grpo+gspo": {"algorithm": {"advantage": "grpo", "policy_loss": "gspo"}},
    "grpo+cispo": {"algorithm": {"advantage": "grpo", "policy_loss": "cispo"}},
}
ITERATIONS, WINDOW = 15, 4
# ReMax's baseline is one greedy rollout, so its reward curve is the noisiest: at 15 iterations its margin was
# 0.17 against the 0.15 bar, and a rounding-level change elsewhere once left it 0.02 short. It gets more
# iterations. More for every variant would not do: DAPO's dynamic sampling then runs out of prompts whose
# group rewards differ (the policy solves 7 of the 8 fixed prompts), which is its documented error.
MORE_ITERATIONS = {"remax": 24}


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory, arithmetic_data):
    """A tiny model after a short SFT on 1-digit sums: about a quarter of sampled answers right."""
    from ascent.models.tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("warm")
    base = make_tiny_checkpoint(root / "base", hidden_size=64, num_layers=2, seed=0)
    cfg = {
        "run_dir": str(root / "sft"),
        "epochs": 40.0,
        "batch_size": 8,
        "model": {"path": str(base)},
        "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 256},
        "tracking": {"progress": False, "tensorboard": False},
    }
    ascent("sft", str(write_yaml(root / "sft.yaml", cfg)))
    return root / "sft" / "final"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_improves_reward(name, tmp_path, warm_model, arithmetic_data):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((arithmetic_data / "train.jsonl").read_text().splitlines(keepends=True)[:8]))
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "seed": 1,
        "iterations": MORE_ITERATIONS.get(name, ITERATIONS),
        "model": {"path": str(warm_model)},
        "data": {"train_path": str(prompts), "max_prompt_tokens": 32},
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
    assert last > first + 0.15, f"{name}: reward {first:.3f} -> {last:.3f} ({[round(r, 2) for r in rewards]})"
