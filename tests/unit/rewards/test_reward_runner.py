"""RewardRunner: per-row functions, dict components, failure counting, logging and the abort threshold."""

from __future__ import annotations

import logging
import math

import pytest

from ascent.config.schema import RewardConfig
from ascent.rewards import RewardFailureError, RewardInput, RewardRunner, resolve_reward_fn, to_reward
from ascent.rewards import runner as runner_module
from ascent.rewards.builtin import ANSWER_KEY_SETTING


def inputs(responses: list[str], answer: str = "4", **extra) -> list[RewardInput]:
    return [
        RewardInput(
            prompt="2+2?",
            response=r,
            response_ids=[1] * len(r),
            metadata={"answer": answer, **extra},
            row_id=i,
        )
        for i, r in enumerate(responses)
    ]


def test_default_builtin_scores_and_metrics():
    result = RewardRunner("exact_match").score(inputs(["4", " 4 ", "5", "four"]))
    assert result.rewards == [1.0, 1.0, 0.0, 0.0]
    assert result.components == [{}] * 4
    assert result.metrics["reward/mean"] == 0.5
    assert result.metrics["reward/failures"] == 0.0 and result.metrics["reward/failure_rate"] == 0.0


def test_row_reward_fn_overrides_default_and_is_cached(monkeypatch):
    resolved: list[str] = []

    def counting_resolve(spec, field="reward.fn"):
        resolved.append(spec)
        return resolve_reward_fn(spec, field)

    monkeypatch.setattr(runner_module, "resolve_reward_fn", counting_resolve)
    runner = RewardRunner("exact_match", kwargs={"format_score": 0.1})
    items = inputs(["#### 4", "#### 5"], reward_fn="gsm8k") + inputs(["4"])
    assert runner.score(items).rewards == [1.0, 0.1, 1.0]
    runner.score(items)
    assert resolved == ["exact_match", "gsm8k"]  # each spec resolved once


def test_dict_returns_become_components():
    def scored(prompt, response, response_ids, metadata):
        return {"reward": float(response == "4"), "length": len(response_ids), "mean": 7}

    result = RewardRunner(scored).score(inputs(["4", "44"]))
    assert result.rewards == [1.0, 0.0]
    assert result.components == [{"length": 1.0, "mean": 7.0}, {"length": 2.0, "mean": 7.0}]
    assert result.metrics["reward/length"] == 1.5
    assert result.metrics["reward/mean"] == 0.5 and result.metrics["reward/component_mean"] == 7.0


def test_to_reward_rejects_bad_values():
    assert to_reward(True) == (1.0, {})
    for bad, message in [
        ("1", "not a number"),
        (None, "not a number"),
        (math.nan, "nan"),
        ({"x": 1}, "'reward' key"),
    ]:
        with pytest.raises((TypeError, ValueError), match=message):
            to_reward(bad)
    with pytest.raises(ValueError, match="component 'x' is inf"):
        to_reward({"reward": 1.0, "x": math.inf})


def flaky(prompt, response, response_ids, metadata):
    if response == "boom":
        raise ZeroDivisionError("division by zero in my reward")
    if response == "nan":
        return float("nan")
    if response == "text":
        return "1.0"
    return 1.0


def test_failures_are_zero_counted_and_logged(caplog):
    runner = RewardRunner(flaky, max_failure_rate=0.5)
    with caplog.at_level(logging.WARNING, logger="ascent.rewards.runner"):
        result = runner.score(inputs(["ok", "boom", "ok", "nan", "ok", "text"]))
    assert result.rewards == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert result.metrics["reward/failures"] == 3.0 and result.metrics["reward/failure_rate"] == 0.5
    assert "failed on row 2: ZeroDivisionError: division by zero in my reward" in caplog.text
    assert "row 4: ValueError: reward is nan" in caplog.text and "row 6: TypeError" in caplog.text


def test_abort_over_max_failure_rate():
    runner = RewardRunner(flaky, max_failure_rate=0.1)
    runner.score(inputs(["ok"] * 9 + ["boom"]))  # exactly 10% is allowed
    with pytest.raises(RewardFailureError) as info:
        runner.score(inputs(["ok"] * 8 + ["boom", "nan"]))
    message = str(info.value)
    assert message.startswith("2 of 10 reward calls failed (20.0%, over reward.max_failure_rate=0.1)")
    assert "first error on row 9: ZeroDivisionError: division by zero in my reward" in message
    assert "Fix the reward function or raise reward.max_failure_rate" in message


def test_missing_answer_counts_as_failure():
    items = [RewardInput("p", "4", [1], {}, row_id=0)]
    with pytest.raises(
        RewardFailureError, match="needs the reference answer in dataset field 'answer'"
    ) as info:
        RewardRunner("exact_match").score(items)
    assert "name the column that holds it with reward.kwargs.answer_key" in info.value.first_error


def test_a_caller_names_the_settings_of_a_reward_error_its_own_way(caplog):
    """`ascent eval` has no reward.kwargs: its runner rewords the missing answer's fix as --answer-key, in
    the logged failures and in the error it raises (the reward function knows neither name)."""
    items = [RewardInput("p", "4", [1], {"solution": "4"}, row_id=i) for i in range(2)]
    runner = RewardRunner("exact_match", max_failure_rate=0.5, settings={ANSWER_KEY_SETTING: "--answer-key"})
    with caplog.at_level(logging.WARNING), pytest.raises(RewardFailureError) as info:
        runner.score(items)
    fix = "the row has fields ['solution']. Add the field or name the column that holds it with --answer-key"
    assert fix in info.value.first_error and fix in str(info.value) and fix in caplog.text
    assert "reward.kwargs" not in info.value.first_error + caplog.text


def test_bad_specs_fail_early():
    with pytest.raises(ValueError, match="reward.fn=nope: not a built-in reward"):
        RewardRunner("nope")
    with pytest.raises(ValueError, match="with kwargs \\['scale'\\]"):
        RewardRunner(flaky, kwargs={"scale": 2})
    runner = RewardRunner("exact_match")
    with pytest.raises(ValueError, match="row 2 reward_fn='missing_mod:f': no module 'missing_mod'"):
        runner.prepare([{"answer": 1}, {"reward_fn": "missing_mod:f"}])
    with pytest.raises(ValueError, match="row 1 reward_fn=typo"):
        runner.score(inputs(["4"], reward_fn="typo"))


def test_built_from_config_and_empty_batch():
    from ascent.config import RunConfig
    from ascent.envs.hosts import InlineHosts
    from ascent.orchestrator.setup import build_reward_runner

    cfg = RunConfig(
        reward=RewardConfig(
            fn="numeric_match", kwargs={"abs_tol": 0.5}, max_failure_rate=0.2, isolation="inline"
        )
    )
    runner = build_reward_runner(cfg)
    assert runner.max_failure_rate == 0.2 and isinstance(runner.executor, InlineHosts)
    assert runner.score(inputs(["about 4.4"])).rewards == [1.0]
    empty = runner.score([])
    assert empty.rewards == [] and empty.metrics["reward/failure_rate"] == 0.0


@pytest.mark.timeout(60)
def test_a_reward_that_ends_its_process_with_status_0_costs_its_sample(caplog):
    """A missed death would wait out reward.timeout_s (120 s); the test's own timeout (60 s) fails that."""
    from ascent.orchestrator.setup import reward_hosts

    pool = reward_hosts(RewardConfig(timeout_s=120.0, num_workers=2))
    runner = RewardRunner("tests.integration.bad_rewards:score", max_failure_rate=0.5, executor=pool)
    items = [
        RewardInput("p", "r", [1], {"answer": a}, row_id=i) for i, a in enumerate(["ok", "os_exit", "ok"])
    ]
    try:
        with caplog.at_level(logging.WARNING, logger="ascent.rewards.runner"):
            result = runner.score(items)
    finally:
        runner.close()
    assert result.rewards == [1.0, 0.0, 1.0] and result.metrics["reward/failures"] == 1.0
    assert "failed on row 2: its process died (exit code 0) while running a reward call" in caplog.text
