"""`ascent eval --reward-config`: a train config's `reward` section scores an evaluation as it scores
training (the function by fn_weight, a reward model in its own worker, an LLM judge on the evaluated
checkpoint's engine); each component has its metrics, every response's reward is the weighted sum of its
components, and a judgement that fails counts without stopping the evaluation. A bad file says so."""

from __future__ import annotations

import json

import pytest
import yaml

from ascent.config.errors import ConfigError
from ascent.config.schema import RewardConfig
from ascent.entrypoints.evaluate import reward_hosting, run_eval
from ascent.models.tiny import make_tiny_checkpoint, make_tiny_reward_model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_rm")
    policy = make_tiny_checkpoint(root / "policy", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    return policy, make_tiny_reward_model(root / "rm", seed=2)


def test_a_reward_model_and_a_judge_score_an_evaluation(tmp_path, checkpoints):
    policy, rm = checkpoints
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(3)))
    reward = {
        "fn": "exact_match",
        "fn_weight": 2.0,
        "model": {"path": str(rm), "weight": 0.5, "max_tokens_per_batch": 128},
        "judge": {"template": "{prompt}={response}? {answer}", "parser": r"(\d)", "max_new_tokens": 3},
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"iterations": 3, "reward": reward}))  # a train config works
    out = tmp_path / "responses.jsonl"
    metrics = run_eval(
        str(policy),
        str(data),
        max_new_tokens=3,
        samples=2,
        temperature=1.0,
        device="cpu",
        reward_config=str(config),
        out=str(out),
    )
    for key in ("reward/fn/mean", "reward/reward_model/mean", "reward/judge/failures", "reward/judge/mean"):
        assert key in metrics
    assert metrics["responses"] == 6.0
    # the random policy's judgements rarely parse: each counted, none fatal
    assert metrics["reward/judge/failures"] == 6 * metrics["reward/judge/failure_rate"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    want = 2.0 * metrics["reward/fn/mean"] + 0.5 * metrics["reward/reward_model/mean"]
    want += metrics["reward/judge/mean"]
    assert abs(sum(r["reward"] for r in rows) / len(rows) - want) < 1e-6
    assert abs(metrics["reward_mean"] - want) < 1e-6 and metrics["reward/reward_model/std"] > 0


def test_a_file_without_a_reward_section_names_the_flag(tmp_path, checkpoints):
    bad = tmp_path / "bad.yaml"
    bad.write_text("iterations: 3\n")
    with pytest.raises(ConfigError, match="--reward-config .*no `reward:` mapping"):
        run_eval(str(checkpoints[0]), str(tmp_path / "none.jsonl"), reward_config=str(bad))
    pinned = tmp_path / "pinned.yaml"  # a training run's pinned judge: an evaluation has no run
    pinned.write_text(yaml.safe_dump({"reward": {"judge": {"model": "policy@2", "template": "{response}"}}}))
    with pytest.raises(ConfigError, match="policy@2 pins a training run's policy version"):
        run_eval(str(checkpoints[0]), str(tmp_path / "none.jsonl"), reward_config=str(pinned))


def test_the_reward_sections_kwargs_and_hosting_apply(tmp_path, checkpoints):
    # before: only reward.fn was read, so a column named by reward.kwargs.answer_key was never found
    # and every call failed
    policy, _ = checkpoints
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1", "target": str(i + 1)}) + "\n" for i in range(3)))
    section = {"fn": "exact_match", "kwargs": {"answer_key": "target"}, "timeout_s": 7.0, "num_workers": 1}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"reward": section}))
    metrics = run_eval(str(policy), str(data), max_new_tokens=2, device="cpu", reward_config=str(config))
    assert metrics["responses"] == 3.0 and metrics["reward_failures"] == 0.0


def test_reward_hosting_takes_the_section_and_the_flags_timeout():
    section = RewardConfig(fn="exact_match", timeout_s=7.0, isolation="inline", memory_limit_mb=64)
    assert reward_hosting(section, None) == section
    over = reward_hosting(section, 2.5)
    assert over.timeout_s == 2.5 and over.isolation == "inline" and over.memory_limit_mb == 64
    assert reward_hosting(None, None) == RewardConfig()
    assert reward_hosting(None, 4.0).timeout_s == 4.0
