"""Settings that the rest of the config makes the run ignore are refused at load time, naming the field, the
value and the fix (`ascent.config.ignored`, and cuda_ipc with split placement in `rules.py`); the same
settings where they are read load fine, and a resolved config (every default listed) reads back."""

from __future__ import annotations

import pytest

from ascent.config import (
    ConfigError,
    RunConfig,
    SFTConfig,
    dump_config,
    load_config,
    parse_yaml,
    validate_config,
)

ENV = "rollout.source={name: env, env: guess_number}"
AGENT = "rollout.source={name: agent, agent: mypkg.agent:run}"
RAY_GPU = ["cluster.backend=ray", "cluster.gpus_per_worker=1", "cluster.device=cuda"]


def problems(overrides: list[str], schema: type = RunConfig) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, schema)
    return info.value.problems


def test_a_reward_function_beside_an_environment_is_refused_with_both_ways_out() -> None:
    (only,) = problems([ENV, "reward.fn=mypkg.rewards:score"])
    assert only.startswith(
        "reward.fn='mypkg.rewards:score': rollout.source env='guess_number' scores its own episodes"
    )
    assert "call it in the environment's step()" in only and "set rollout.source=prompt" in only
    (kwargs,) = problems([ENV, "reward.kwargs={tolerance: 0.1}"])
    assert kwargs.startswith("reward.kwargs={tolerance: 0.1}:")
    load_config(None, ["reward.fn=mypkg.rewards:score"])  # single-turn: the function scores
    load_config(None, [AGENT, "reward.fn=mypkg.rewards:score"])  # scores None replies
    load_config(None, [ENV, "reward.max_failure_rate=0.2"])  # bounds the environment's failures too


def test_cuda_ipc_with_split_placement_is_refused() -> None:
    (only,) = problems([*RAY_GPU, "cluster.placement=split", "cluster.weight_transport=cuda_ipc"])
    assert only.startswith("cluster.weight_transport=cuda_ipc:") and "cluster.placement=split" in only
    assert "use broadcast" in only
    load_config(None, [*RAY_GPU, "cluster.placement=split", "cluster.weight_transport=broadcast"])
    load_config(None, [*RAY_GPU, "cluster.weight_transport=cuda_ipc"])  # colocated


def test_validation_settings_without_validation_data_are_refused() -> None:
    got = problems(["val_every=2", "data.max_val_prompts=8", "rollout.val_temperature=0.7"])
    assert [p.split(":")[0] for p in got] == [
        "data.max_val_prompts=8",
        "val_every=2",
        "rollout.val_temperature=0.7",
    ]
    assert all("set data.val_path" in p for p in got)
    load_config(None, ["val_every=2", "data.val_path=val.jsonl"])
    (sft,) = problems(["val_every=5"], SFTConfig)
    assert sft.startswith("val_every=5: there is no validation data (data.val_path is not set)")


def test_episode_settings_of_a_single_turn_run_are_refused() -> None:
    (timeout, workers) = problems(["rollout.env_workers=2", "rollout.env_timeout_s=5"])
    assert workers.startswith(
        "rollout.env_workers=2: only multi-turn episodes (an env or agent rollout.source) read"
    )
    assert "set rollout.source: {name: env, env: ...}" in workers and timeout.startswith(
        "rollout.env_timeout_s=5"
    )
    load_config(None, [ENV, "rollout.env_workers=2"])
    load_config(None, [AGENT, "rollout.env_workers=2"])
    # a source's own settings: the other sources cannot be given them (sources.source_problems)
    (agent_only,) = problems([ENV, "rollout.source.timeout_s=10"])
    assert agent_only.startswith("rollout.source.timeout_s=10: only source=agent reads it")


def test_cluster_settings_that_do_not_apply_are_refused() -> None:
    (inline,) = problems(["cluster.weight_transport=broadcast"])
    assert inline.startswith("cluster.weight_transport=broadcast: with cluster.backend=inline")
    (split,) = problems(["cluster.backend=ray", "cluster.placement=split", "cluster.engine_sleeps=false"])
    assert (
        split.startswith("cluster.engine_sleeps=false: only colocated placement") and "never sleep" in split
    )
    load_config(None, ["cluster.backend=ray", "cluster.engine_sleeps=false"])


def test_a_kl_estimator_of_a_kl_term_that_is_off_is_refused() -> None:
    (loss,) = problems(["algorithm.kl_estimator=k1"])
    assert loss == (
        "algorithm.kl_estimator='k1': only the KL loss uses it, and algorithm.kl_loss_coef=0 turns that off; "
        "set algorithm.kl_loss_coef above 0, or remove it."
    )
    (penalty,) = problems(["algorithm.kl_penalty_estimator=k3"])
    assert penalty.startswith("algorithm.kl_penalty_estimator='k3': only the KL reward penalty uses it")
    load_config(None, ["algorithm.kl_estimator=k1", "algorithm.kl_loss_coef=0.1"])


def test_a_resolved_config_with_every_default_reads_back() -> None:
    for overrides in (
        [ENV, "rollout.source.max_turns=3"],
        ["rollout.source={name: agent, agent: m:run, concurrency: 2}"],
        ["data.val_path=v.jsonl", "val_every=1"],
    ):
        cfg = load_config(None, overrides)
        assert validate_config(parse_yaml(dump_config(cfg), "config.yaml")) == cfg


def test_a_truncation_side_without_truncation_is_refused() -> None:
    for schema in (RunConfig, SFTConfig):
        (only,) = problems(["data.truncation_side=right"], schema)
        assert only.startswith("data.truncation_side='right': only data.overlong_prompts=truncate")
        assert "it is 'drop'" in only
        load_config(None, ["data.truncation_side=right", "data.overlong_prompts=truncate"], schema)
        load_config(None, ["data.overlong_prompts=error"], schema)  # the default side: nothing to refuse
