"""`reward.model` and `reward.judge` through `ascent train`: one iteration on the tiny model with a tiny
reward model (its own worker group) and the policy's replicas as the judge; each component is in the
metrics, and every trained episode's reward is the weighted sum of its recorded components."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from ascent.models.tiny import make_tiny_reward_model
from ascent.tracking.experience_store import open_store
from tests.integration.conftest import ascent_here, run_config, write_yaml


def test_a_reward_model_and_a_judge_score_a_run(
    tmp_path: Path, tiny_model: Path, arithmetic_data: Path
) -> None:
    rm = make_tiny_reward_model(tmp_path / "rm", seed=2)
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    cfg["data"].pop("val_path")
    cfg["train"]["trajectories_per_update"] = 8  # one optimizer step, no separate old-logprob pass
    cfg["reward"] = {
        "isolation": "inline",
        "fn_weight": 1.0,
        "max_failure_rate": 1.0,  # the random policy's judgements rarely parse: counted, not fatal
        "model": {"path": str(rm), "weight": 0.5, "max_tokens_per_batch": 128},
        "judge": {"template": "{prompt}={response}? {answer}", "parser": r"(\d)", "max_new_tokens": 4},
    }
    cfg["tracking"] |= {"tensorboard": False, "trace": False}
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))

    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "reward/reward_model/mean" in m)
    for key in (
        "reward/fn/mean",
        "reward/judge/mean",
        "reward/judge/failures",
        "reward/judge/cache_hit_rate",
    ):
        assert key in step
    with open_store(tmp_path / "run") as store:
        episodes = list(store.episodes())
    assert len(episodes) == 8
    for e in episodes:
        parts = e.reward_components
        assert abs(e.reward - (parts["fn"] + 0.5 * parts["reward_model"] + parts["judge"])) < 1e-6
    rm_scores = [e.reward_components["reward_model"] for e in episodes]
    assert abs(step["reward/reward_model/mean"] - sum(rm_scores) / len(rm_scores)) < 1e-6
    assert len(set(rm_scores)) > 1  # scored per episode, not one constant


def test_a_judge_pinned_at_a_policy_version_keeps_it_and_a_resume_loads_it(
    tmp_path: Path, tiny_model: Path, arithmetic_data: Path
) -> None:
    """`reward.judge.model=policy@1`: the weights published after iteration 1 are kept for the judge in
    <run_dir>/judge/v1 (equal to the trainer's checkpoint of iteration 1), and a run resumed past version 1
    takes them from there (without the copy it stops and names it: tests/unit/transport/test_pinned.py)."""
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=3, val_every=0)
    cfg["data"].pop("val_path")
    cfg["reward"] = {
        "isolation": "inline",
        "max_failure_rate": 1.0,
        # the fast engine (eager on CPU) judges: the reference engine's pinned judge is tests/unit/transport
        "judge": {
            "model": "policy@1",
            "engine": "fast",
            "template": "{prompt}={response}?",
            "max_new_tokens": 1,
        },
    }
    cfg["checkpoint"] = {"every": 1, "keep_last": 3}
    cfg["tracking"] |= {"tensorboard": False, "trace": False}
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    run = tmp_path / "run"
    pinned = load_file(str(run / "judge" / "v1" / "model.safetensors"))
    trained = load_file(str(run / "checkpoints" / "iter_000001" / "model.safetensors"))
    assert set(trained) <= set(pinned) and all(torch.equal(pinned[k], trained[k]) for k in trained)

    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    cfg["run_dir"] = str(resumed)
    resume = str(write_yaml(tmp_path / "resumed.yaml", cfg))
    ascent_here("train", resume, "resume=true", "--resume-from", "iter_000002")
    log = (resumed / "logs" / "controller.log").read_text()
    assert f"policy version 1 loaded from {resumed / 'judge' / 'v1' / 'model.safetensors'}" in log
