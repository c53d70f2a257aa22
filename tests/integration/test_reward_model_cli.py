"""`reward.model` and `reward.judge` through `ascent train`: one iteration on the tiny model with a tiny
reward model (its own worker group) and the policy's replicas as the judge; each component is in the
metrics, and every trained episode's reward is the weighted sum of its recorded components."""

from __future__ import annotations

import json
from pathlib import Path

from ascent.models.tiny import make_tiny_reward_model
from ascent.tracking.experience_store import open_store
from tests.integration.conftest import ascent, run_config, write_yaml


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
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))

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
