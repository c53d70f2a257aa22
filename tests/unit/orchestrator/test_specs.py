"""The workers' specs (`ascent.orchestrator.specs`): each config field reaches the spec field its worker
reads, no config section crosses into a spec, specs pickle (Ray), and the policy loss gets the settings of
its choice, the same whether the config writes them flat (the older form) or under `algorithm.policy_loss`."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from pydantic import BaseModel

from ascent.config import LoraConfig, RunConfig, SFTConfig, load_config
from ascent.entrypoints import sft
from ascent.orchestrator.specs import critic_spec, engine_spec, lora_settings, loss_settings, trainer_spec


@pytest.mark.parametrize(
    ("overrides", "name", "opts"),
    [
        ([], "ppo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "dual_clip_c": None}),
        (  # DAPO's clip-higher with a dual clip, flat as in the examples
            ["algorithm.clip_ratio_high=0.28", "algorithm.dual_clip_c=3"],
            "ppo",
            {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip_c": 3.0},
        ),
        (
            ["algorithm.policy_loss={name: ppo, clip_ratio_high: 0.28, dual_clip_c: 3}"],
            "ppo",
            {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip_c": 3.0},
        ),
        (["algorithm.policy_loss=gspo"], "gspo", {"gspo_clip_low": 3e-4, "gspo_clip_high": 4e-4}),
        (
            ["algorithm.policy_loss=gspo", "algorithm.policy_loss.gspo_clip_low=1e-3"],
            "gspo",
            {"gspo_clip_low": 1e-3, "gspo_clip_high": 4e-4},
        ),
        (["algorithm.policy_loss=sapo"], "sapo", {"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05}),
        (["algorithm.policy_loss=reinforce"], "reinforce", {}),
    ],
)
def test_the_loss_gets_its_choices_settings(overrides: list[str], name: str, opts: dict) -> None:
    settings = loss_settings(load_config(None, overrides).algorithm, max_new_tokens=8)
    assert (settings.policy_loss, settings.loss_opts) == (name, opts)


def test_a_plugin_loss_gets_the_options_and_shared_settings_it_names() -> None:
    path = "tests.unit.orchestrator.test_specs:_plugin_loss"
    algo = load_config(None, [f"algorithm.policy_loss={path}", "algorithm.options={temp: 0.5}"]).algorithm
    settings = loss_settings(algo)
    assert (settings.policy_loss, settings.loss_opts) == (path, {"temp": 0.5, "adv_eps": 1e-6})


def _plugin_loss(  # type: ignore[no-untyped-def]
    logprobs, old, adv, mask, seq_ids, *, temp=1.0, adv_eps=0.0, clip_ratio_low=0.0
):
    return logprobs, {}


def _cfg(**sections: Any) -> RunConfig:
    return RunConfig(**({"model": {"path": "m"}, "data": {"train_path": "d.jsonl"}} | sections))


def _flat(spec: Any) -> None:
    """No config section anywhere in `spec` (its fields, nested settings, and their containers)."""
    assert not isinstance(spec, BaseModel), spec
    if dataclasses.is_dataclass(spec):
        for f in dataclasses.fields(spec):
            _flat(getattr(spec, f.name))
    elif isinstance(spec, dict):
        for v in spec.values():
            _flat(v)
    elif isinstance(spec, (list, tuple)):
        for v in spec:
            _flat(v)


def test_trainer_spec_carries_each_field_the_trainer_reads():
    c = load_config(
        None,
        [
            "model.path=m",
            "model.tokenizer_path=t",
            "model.dtype=bf16",
            "model.gradient_checkpointing=true",
            "model.trust_remote_code=true",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "model.lora.target_modules=[q_proj]",
            "train.lr=3e-4",
            "train.betas=[0.8, 0.9]",
            "train.warmup_steps=2",
            "train.schedule=cosine",
            "train.max_grad_norm=0.5",
            "train.max_tokens_per_micro_batch=960",
            "train.logprob_chunk_tokens=32",
            "train.keep_head_logits=true",
            "train.compile=off",
            "train.attention=sdpa",
            "algorithm.kl_loss_coef=0.1",
            "algorithm.entropy_coef=0.01",
            "algorithm.rollout_correction=mis",
            "rollout.temperature=0.7",
            "rollout.max_new_tokens=40",
            "cluster.device=cpu",
        ],
    )
    spec = trainer_spec(c, total_optimizer_steps=12)
    assert (spec.model_path, spec.tokenizer_path, spec.device, spec.dtype) == ("m", "t", "cpu", "bf16")
    assert spec.gradient_checkpointing and spec.trust_remote_code and spec.need_reference
    assert (spec.lora.rank, spec.lora.alpha, spec.lora.target_modules) == (4, 8.0, ("q_proj",))
    optim = spec.optim
    assert (optim.lr, optim.betas, optim.total_steps, optim.max_grad_norm) == (3e-4, (0.8, 0.9), 12, 0.5)
    assert (optim.warmup_steps, optim.schedule) == (2, "cosine")
    assert (spec.max_tokens_per_micro_batch, spec.logprob_chunk_tokens) == (960, 32)
    assert spec.keep_head_logits and not trainer_spec(_cfg(), 1).keep_head_logits
    assert (spec.compile, spec.attention, spec.temperature) == ("off", "sdpa", 0.7)
    loss = spec.loss
    assert (loss.kl_loss_coef, loss.entropy_coef, loss.rollout_correction) == (0.1, 0.01, "mis")
    assert spec.loss.max_len == 40  # the Dr. GRPO divisor defaults to the response budget
    assert not trainer_spec(_cfg(), 1).need_reference
    assert trainer_spec(_cfg(algorithm={"advantage": "gae", "kl_penalty_coef": 0.1}), 1).need_reference


def test_critic_spec_takes_its_own_lr_and_clip_on_the_policys_model_and_schedule():
    c = _cfg(
        model={"path": "m", "dtype": "bf16"},
        train={"lr": 3e-4, "schedule": "cosine", "max_tokens_per_micro_batch": 960, "sharding": "fsdp"},
        algorithm={"advantage": "gae", "critic_lr": 2e-5, "value_clip": 0.5},
    )
    spec = critic_spec(c, total_optimizer_steps=7)
    assert (spec.model_path, spec.dtype, spec.value_clip, spec.sharding) == ("m", "bf16", 0.5, "fsdp")
    assert spec.max_tokens_per_micro_batch == 960
    assert (spec.optim.lr, spec.optim.schedule, spec.optim.total_steps) == (2e-5, "cosine", 7)


def test_engine_spec_gives_each_engine_only_its_own_settings():
    ref = engine_spec(_cfg(rollout={"generation_batch_size": 5}))
    flat = {"model_path": "m", "dtype": "fp32", "device": "auto", "trust_remote_code": False}
    assert ref.builder_kwargs() == flat | {"generation_batch_size": 5}
    fast = engine_spec(_cfg(model={"path": "m", "tokenizer_path": "t"}, rollout={"engine": "fast"}))
    kw = fast.builder_kwargs()
    assert fast.tokenizer_path == "t" and "generation_batch_size" not in kw
    assert kw["on_swap"] == "continue" and kw["gpu_memory_fraction"] == fast.gpu_memory_fraction


def test_sft_builds_its_own_trainer_spec():
    c = SFTConfig(model={"path": "m"}, data={"train_path": "d.jsonl"}, train={"lr": 3e-3})
    spec = sft.trainer_spec(c, steps=9)
    assert (spec.loss.policy_loss, spec.loss.loss_aggregation, spec.loss.max_len) == (
        "reinforce",
        "token-mean",
        None,
    )
    assert spec.loss.rollout_correction is None and spec.loss.kl_loss_coef == 0 and not spec.need_reference
    assert (spec.optim.lr, spec.optim.total_steps, spec.temperature) == (3e-3, 9, 1.0)


def test_specs_are_flat_and_pickle():
    c = _cfg(algorithm={"advantage": "gae", "policy_loss": {"name": "ppo", "clip_ratio_high": 0.28}})
    sft_cfg = SFTConfig(model={"path": "m"}, data={"train_path": "d.jsonl"})
    for spec in (trainer_spec(c, 3), critic_spec(c, 3), engine_spec(c), sft.trainer_spec(sft_cfg, 3)):
        _flat(spec)
        assert pickle.loads(pickle.dumps(spec)) == spec
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.model_path = "elsewhere"  # type: ignore[misc]


def test_lora_publish_reaches_the_trainer() -> None:
    assert not lora_settings(LoraConfig(rank=4)).publish_adapter
    assert lora_settings(LoraConfig(rank=4, publish="adapter")).publish_adapter
