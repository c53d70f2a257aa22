"""The run's health on the controller: the sampler/trainer mismatch counts sampled tokens only, a mini-batch
without a gradient is not stepped, equal rewards warn once, a diverged run stops naming what and where."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ascent.config import RunConfig
from ascent.messages import Episode, Group, TrainSample
from ascent.orchestrator import batch as B
from ascent.orchestrator import health

# a two-turn episode: 3 sampled tokens, 2 tool tokens (mask 0, sampler logprob 0.0), 2 sampled tokens
MASK = [1, 1, 1, 0, 0, 1, 1]
SAMPLER = [-1.2, -0.3, -2.0, 0.0, 0.0, -0.7, -1.5]
TRAINER = [-1.2, -0.3 + 1e-6, -2.0, -9.5, -14.0, -0.7, -1.5 - 2e-6]  # the tool tokens are unlikely text


def multi_turn(reward: float = 0.0) -> Episode:
    ids = [5, 6, 7, 8, 9, 10, 11]
    return Episode([1, 2], ids, SAMPLER, MASK, finish_reason="stop", row_id=0, reward=reward)


def test_the_mismatch_and_its_outliers_count_only_sampled_tokens(tmp_path: Path) -> None:
    mean, top = B.logprob_diff([TRAINER], [SAMPLER], [MASK])
    assert top == pytest.approx(2e-6, abs=1e-9) and mean < 1e-5
    assert B.record_logprob_outliers(str(tmp_path), 1, [multi_turn()], [TRAINER]) == 0
    assert not (tmp_path / "logprob_outliers.jsonl").exists()
    far = TRAINER[:6] + [-3.0]  # a sampled token 1.5 nats off is listed, with its position
    assert B.record_logprob_outliers(str(tmp_path), 1, [multi_turn()], [far]) == 1
    (row,) = [json.loads(x) for x in (tmp_path / "logprob_outliers.jsonl").read_text().splitlines()]
    assert row["position"] == 6 and row["sampler"] == -1.5


def sample(advantages: list[float], mask: list[int]) -> TrainSample:
    n = len(advantages)
    return TrainSample(prompt_ids=[1], response_ids=[5] * n, loss_mask=mask, advantages=advantages)


def test_a_mini_batch_is_stepped_only_with_a_gradient_to_follow() -> None:
    zero = [sample([0.0, 0.0], [1, 1]), sample([0.0, 0.7], [1, 0])]  # a nonzero advantage on a tool token
    signal = [*zero, sample([0.0, -0.3], [1, 1])]
    assert not health.has_policy_gradient(zero) and health.has_policy_gradient(signal)
    assert not health.steps_mini_batch(zero, step_on_zero_advantage=False, other_terms=False)
    assert health.steps_mini_batch(zero, step_on_zero_advantage=True, other_terms=False)
    assert health.steps_mini_batch(zero, step_on_zero_advantage=False, other_terms=True)  # KL / entropy
    assert health.steps_mini_batch(signal, step_on_zero_advantage=False, other_terms=False)


def test_equal_rewards_warn_once_after_three_iterations_in_a_row() -> None:
    rollout = {"prompts_per_step": 8, "samples_per_prompt": 2, "temperature": 0.3}
    cfg = RunConfig(rollout=rollout, train={"trajectories_per_update": 16})
    equal = [Group((multi_turn(1.0), multi_turn(1.0))), Group((multi_turn(0.0), multi_turn(0.0)))]
    mixed = [Group((multi_turn(1.0), multi_turn(0.0)))]
    watch = health.EqualRewardWatch(health.RunFacts.of(cfg))
    seen = [watch.observe(g, it, 0.25) for it, g in enumerate([equal, equal, mixed, equal, equal], 1)]
    assert seen == [None] * 5  # a mixed iteration restarts the count
    message = watch.observe(equal, 6, 0.25)
    assert message is not None and "iterations 4-6" in message
    for cause in ("reward.fn='exact_match'", "samples_per_prompt=2", "temperature=0.3", "25% were truncated"):
        assert cause in message
    assert watch.observe(equal, 7, 0.25) is None  # once


def metrics(**kw: float) -> dict[str, float]:
    return {"loss/total": 0.1, "grad_norm": 0.8, "entropy": 1.2, "train/zero_grad_frac": 0.0, **kw}


@pytest.mark.parametrize(
    ("bad", "metric"),
    [
        ({"loss/total": math.nan}, "loss/total"),
        ({"grad_norm": math.inf}, "grad_norm"),
        ({"entropy": 0.995 * math.log(100)}, "entropy"),
        ({"grad_norm": 0.0, "train/zero_grad_frac": 1.0}, "grad_norm"),
    ],
)
def test_divergence_is_named(bad: dict[str, float], metric: str) -> None:
    check = health.DivergenceCheck(health.RunFacts.of(RunConfig()), vocab_size=100)
    assert check.diverged(metrics()) is None  # the first iteration: entropy well below log(100)
    found = check.diverged(metrics(**bad))
    assert found is not None and found[0] == metric


def test_what_is_not_divergence() -> None:
    check = health.DivergenceCheck(health.RunFacts.of(RunConfig()), vocab_size=100)
    at_max = 0.999 * math.log(100)
    assert check.diverged(metrics(entropy=at_max)) is None  # a random-init model starts uniform
    assert check.diverged(metrics(entropy=at_max, grad_norm=0.0, **{"train/zero_grad_frac": 0.5})) is None
    fp16 = health.DivergenceCheck(health.RunFacts.of(RunConfig(model={"dtype": "fp16"})), vocab_size=100)
    assert fp16.diverged(metrics(grad_norm=math.inf)) is None  # the loss scaler's overflow, by design
    clipped = {"grad_norm": 0.0, "clipfrac": 1.0}
    assert not health.zero_gradient(clipped) and health.zero_gradient({"grad_norm": 0.0, "clipfrac": 0.5})


def test_the_message_names_metric_iteration_last_checkpoint_and_fix(tmp_path: Path) -> None:
    cfg = RunConfig(run_dir=str(tmp_path), train={"lr": 1e3, "max_grad_norm": None})
    check = health.DivergenceCheck(health.RunFacts.of(cfg), vocab_size=100)
    with pytest.raises(health.TrainingDiverged, match="no checkpoint was saved before it"):
        check.check(metrics(grad_norm=math.nan), 1)
    good = tmp_path / "checkpoints" / "iter_000002"
    good.mkdir(parents=True)
    (good / "state.json").write_text("{}")
    with pytest.raises(health.TrainingDiverged) as err:
        check.check(metrics(grad_norm=math.nan), 3)
    text = str(err.value)
    assert err.value.exit_code == 2
    parts = ("iteration 3", "grad_norm=nan", str(good), "--resume-from iter_000002", "train.lr (now 1000.0)")
    for part in (*parts, "set train.max_grad_norm (now null"):
        assert part in text, part
