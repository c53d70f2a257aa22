"""Validation errors read as one line per problem: field path, bad value, fix."""

from __future__ import annotations

import pytest

from ascent.config import ConfigError, RunConfig, SFTConfig, load_config
from ascent.config.sources import EnvSourceConfig
from ascent.errors import AscentError

ENV = "rollout.source={name: env, env: guess_number}"


def problems(overrides: list[str], schema: type = RunConfig) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, schema)
    assert str(info.value) == "\n".join(info.value.problems)
    return info.value.problems


def test_config_error_is_a_user_error() -> None:
    assert issubclass(ConfigError, AscentError)
    assert ConfigError("x").exit_code == 2


def test_unknown_key_suggests_the_close_match() -> None:
    assert problems(["rollout.samples_per_promt=3"]) == [
        "unknown key 'rollout.samples_per_promt'; did you mean 'rollout.samples_per_prompt'?"
    ]
    assert problems(["rollouts.samples_per_prompt=3"]) == ["unknown key 'rollouts'; did you mean 'rollout'?"]
    assert problems(["model.lora.rnak=3"]) == [
        "unknown key 'model.lora.rnak'; did you mean 'model.lora.rank'?"
    ]


def test_unknown_key_in_the_wrong_section_points_to_the_right_one() -> None:
    (msg,) = problems(["rollout.lr=3"])
    assert msg.startswith("unknown key 'rollout.lr'; did you mean 'train.lr'?")


def test_unknown_key_without_a_match_lists_the_section() -> None:
    (msg,) = problems(["checkpoint.zzz=1"])
    assert (
        msg == "unknown key 'checkpoint.zzz'; section 'checkpoint' has: "
        "every, keep_last, save_optimizer, hf_weights, on_interrupt."
    )


def test_constraint_error_names_path_value_and_description() -> None:
    assert problems(["train.lr=-1"]) == ["train.lr=-1: must be > 0 (Peak learning rate of AdamW)."]
    (msg,) = problems(["rollout.top_p=1.5"])
    assert msg == "rollout.top_p=1.5: must be <= 1 (Nucleus sampling mass)."


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.dtype=bf17", "model.dtype='bf17': must be one of 'bf16', 'fp16' or 'fp32' (Compute dtype"),
        ("rollout.max_new_tokens=lots", "rollout.max_new_tokens='lots': must be a whole number (Most tokens"),
        ("rollout.max_new_tokens=1.5", "rollout.max_new_tokens=1.5: must be a whole number"),
        ("rollout.stop_token_ids=[1,x]", "rollout.stop_token_ids[1]='x': must be a whole number"),
        ("rollout.stop_token_ids=5", "rollout.stop_token_ids=5: must be a list"),
        ("resume=maybe", "resume='maybe': must be true or false"),
        ("model=3", "model=3: must be a section"),
        ("model.path=[a]", "model.path=[a]: must be text"),
        ("train.betas=[0.9]", "train.betas[1] is missing (AdamW betas)."),
    ],
)
def test_type_errors(override: str, expected: str) -> None:
    (msg,) = problems([override])
    assert msg.startswith(expected), msg


def test_every_problem_is_reported() -> None:
    msgs = problems(["train.lr=0", "rollout.top_k=-1", "seeed=1"])
    assert len(msgs) == 3
    assert any(m.startswith("train.lr=0:") for m in msgs)
    assert any(m.startswith("rollout.top_k=-1:") for m in msgs)
    assert any("did you mean 'seed'" in m for m in msgs)


def test_cross_field_rules_pass_through_unchanged() -> None:
    msgs = problems(["rollout.samples_per_prompt=1", "train.trajectories_per_update=8"])
    assert msgs == [
        "rollout.samples_per_prompt=1: GRPO compares samples within a group; set it to 2 or more."
    ]


def test_batch_divisibility_rule() -> None:
    (msg,) = problems(["train.trajectories_per_update=48"])
    assert msg.startswith("train.trajectories_per_update=48: one iteration makes")
    assert "divisor of 64" in msg


def test_unknown_kl_estimator_is_caught_whatever_the_lora_rank() -> None:
    for rank in ("0", "8"):
        (msg,) = problems(
            ["algorithm.kl_estimator=k9", "algorithm.kl_loss_coef=0.1", f"model.lora.rank={rank}"]
        )
        assert msg.startswith("algorithm.kl_estimator='k9': unknown")
    load_config(None, ["algorithm.kl_estimator=mypkg.kl:estimate", "algorithm.kl_loss_coef=0.1"])


def test_sft_schema_errors() -> None:
    (msg,) = problems(["samples_per_prompt=2"], SFTConfig)
    assert msg.startswith("unknown key 'samples_per_prompt'")
    assert problems(["batch_size=0"], SFTConfig) == [
        "batch_size=0: must be > 0 (Prompt/response pairs per optimizer step)."
    ]


def test_sft_refuses_rl_only_train_fields() -> None:
    """An SFT config that sets a field only the RL loop reads is refused, naming it; defaults pass."""
    with pytest.raises(ValueError) as err:
        SFTConfig.model_validate({"train": {"trajectories_per_update": 3, "old_logprobs": "recompute"}})
    text = str(err.value)
    assert "train.trajectories_per_update=3: `ascent sft` does not read this RL field" in text
    assert "train.old_logprobs='recompute'" in text
    SFTConfig.model_validate({"train": {"lr": 1e-3, "max_tokens_per_micro_batch": 1024}})


def test_sft_refuses_rl_cluster_fields_and_ranks_it_cannot_run() -> None:
    with pytest.raises(ValueError) as err:
        SFTConfig.model_validate({"cluster": {"num_rollout_workers": 2, "num_trainer_workers": 3}})
    text = str(err.value)
    assert "cluster.num_rollout_workers=2: `ascent sft` does not read this RL field" in text
    assert "cluster.num_trainer_workers=3: several trainer ranks run as Ray actors" in text
    assert "batch_size=32: each batch is split evenly over cluster.num_trainer_workers=3" in text
    SFTConfig.model_validate({"cluster": {"backend": "ray", "num_trainer_workers": 2}})


def test_an_agent_run_refuses_what_agents_do_not_support_yet() -> None:
    (only,) = problems(["rollout.source={name: agent, agent: pkg.mod:run}", "algorithm.advantage=remax"])
    assert only.startswith(
        "algorithm.advantage='remax': its greedy baseline is single-turn; with rollout.source=agent"
    )


def test_episodes_run_on_either_engine_and_name_what_they_still_refuse() -> None:
    for engine in ("reference", "fast"):
        cfg = load_config(None, [ENV, f"rollout.engine={engine}", "rollout.max_staleness=1"])
        got = (cfg.rollout.source, cfg.rollout.engine, cfg.rollout.max_staleness)
        assert got == (EnvSourceConfig(env="guess_number"), engine, 1)
    (msg,) = problems([ENV, "rollout.engine=fast", "algorithm.overlong_buffer=4"])
    assert msg.startswith(
        "algorithm.overlong_buffer=4: the overlong penalty is single-turn; set it to 0 with "
        "rollout.source=env"
    )


def test_val_pass_k_must_fit_the_validation_samples() -> None:
    val = "data.val_path=v.jsonl"
    (msg,) = problems([val, "rollout.val_pass_k=[1,4]", "rollout.val_samples_per_prompt=2"])
    assert msg.startswith("rollout.val_pass_k=[1, 4]: pass@k and mean@k need 1 <= k <=")
    assert "[4] do not fit" in msg
    load_config(None, [val, "rollout.val_pass_k=[1,4]", "rollout.val_samples_per_prompt=4"])
    (msg,) = problems(["rollout.val_pass_k=[1]"])
    assert msg.startswith("rollout.val_pass_k=[1]: there is no validation data")


def test_system_prompt_needs_the_chat_template_and_a_prompt_source() -> None:
    (msg,) = problems(["data.system_prompt=Be brief.", "data.chat_template=false"])
    assert msg.startswith("data.system_prompt is set, but data.chat_template=false")
    msgs = problems(["data.system_prompt=Be brief.", ENV])
    assert any(m.startswith("data.system_prompt is set, but rollout.source=env") for m in msgs)


def test_action_tokens_run_on_either_engine() -> None:
    for engine in ("reference", "fast"):
        load_config(None, [ENV, f"rollout.engine={engine}", "rollout.action_token_ids=[5,6]"])


def test_adapter_publication_needs_engines_that_keep_their_weights() -> None:
    adapter = ["model.lora.publish=adapter", "rollout.engine=fast"]
    got = problems([*adapter, "train.sharding=fsdp"])
    assert [p.split(":")[0] for p in got] == ["model.lora.publish=adapter"] * 3  # rank 0, colocated, fsdp
    assert "cluster.placement=split" in got[1] and "train.sharding=fsdp" in got[2]
    ok = [*adapter, "model.lora.rank=4"]
    load_config(None, [*ok, "cluster.engine_sleeps=false"])
    load_config(None, [*ok, "cluster.placement=split", "cluster.backend=ray"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.lr=inf", "train.lr='inf': must be a finite number (Peak learning rate of AdamW)."),
        ("train.lr=.inf", "train.lr=inf: must be a finite number (Peak learning rate of AdamW)."),
        ("rollout.temperature=inf", "rollout.temperature='inf': must be a finite number"),
        ("seed=-1", "seed=-1: must be >= 0"),
        ("seed=99999999999999999999", "seed=99999999999999999999: must be <= 4294967295"),
        ("run_dir=", "run_dir='': string should have at least 1 character"),
    ],
)
def test_values_that_would_crash_or_train_nothing_are_refused(override: str, expected: str) -> None:
    # before: lr=inf was accepted (an infinite step), seed=-1 crashed with a traceback, and an empty
    # run_dir wrote the run into the current directory
    (msg,) = problems([override])
    assert msg.startswith(expected), msg


def test_infinity_stays_a_valid_no_bound_where_a_field_allows_it() -> None:
    assert load_config(None, ["train.max_grad_norm=.inf"]).train.max_grad_norm == float("inf")
    assert problems(["train.max_grad_norm=.nan"]) == [
        "train.max_grad_norm=nan: must be > 0 (Clip the gradient norm; null disables)."
    ]
