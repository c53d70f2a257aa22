"""Config fields reach the parts that use them: the builders' flat arguments carry each one."""

from __future__ import annotations

from ascent.config import RunConfig
from ascent.orchestrator import setup
from ascent.orchestrator.batch import sampling_params


def cfg(**sections) -> RunConfig:
    return RunConfig(**({"model": {"path": "m"}, "data": {"train_path": "d.jsonl"}} | sections))


def test_dr_grpo_divisor_defaults_to_max_new_tokens_for_every_worker():
    from ascent.trainer.settings import loss_settings_from_config

    c = cfg(rollout={"max_new_tokens": 96}, algorithm={"loss_aggregation": "seq-mean-token-sum-norm"})
    kw = setup.trainer_kwargs(c, total_optimizer_steps=10)
    assert kw["max_new_tokens"] == 96
    assert loss_settings_from_config(c.algorithm, kw["max_new_tokens"]).max_len == 96
    c2 = cfg(rollout={"max_new_tokens": 96}, algorithm={"max_response_tokens_norm": 50})
    assert (
        loss_settings_from_config(c2.algorithm, setup.trainer_kwargs(c2, 10)["max_new_tokens"]).max_len == 50
    )


def test_engine_gets_trust_remote_code_and_sampling_gets_repetition_penalty():
    c = cfg(
        model={"path": "m", "trust_remote_code": True}, rollout={"repetition_penalty": 1.2, "engine": "fast"}
    )
    assert setup.engine_kwargs(c)["trust_remote_code"] is True
    assert sampling_params(c.rollout).repetition_penalty == 1.2
    assert sampling_params(c.rollout, validation=True).repetition_penalty == 1.0


def test_reward_isolation_settings_build_the_pool():
    runner = setup.build_reward_runner(cfg(reward={"timeout_s": 2.5, "num_workers": 3}))
    assert runner.executor.timeout_s == 2.5 and runner.executor.num_workers == 3
    assert setup.build_reward_runner(cfg(reward={"isolation": "inline"})).executor is None
