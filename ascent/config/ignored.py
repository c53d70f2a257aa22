"""Settings a config accepts but the run would never read, given the rest of the config: refused at load time
(with `rules.py`'s other cross-field rules), each naming the field, its value and what to change.

A setting counts as given when it differs from its default: a resolved `config.yaml` lists every default, and
reading it back must not trip these rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ascent.config.errors import show_value
from ascent.config.sources import EnvSourceConfig

if TYPE_CHECKING:
    from ascent.config.schema import RunConfig, SFTConfig

# `reward` fields that only score single-turn responses (max_failure_rate also bounds env/agent failures)
REWARD_SCORING_FIELDS = ("fn", "kwargs", "isolation", "timeout_s", "num_workers", "memory_limit_mb")
# `rollout` fields of multi-turn episodes (an env or agent rollout.source; the source's own settings are its
# union member's fields, so no source can be given another's)
MULTI_TURN_FIELDS = (
    "env_isolation",
    "env_timeout_s",
    "env_memory_limit_mb",
    "env_workers",
    "env_cpus",
    "env_workers_per_node",
    "env_gpus",
)


def _given(section: BaseModel, names: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(name, value) of the fields of `section` among `names` that differ from their defaults."""
    fields = type(section).model_fields
    out = []
    for name in names:
        value = getattr(section, name)
        if value != fields[name].get_default(call_default_factory=True):
            out.append((name, value))
    return out


def ignored_run_settings(cfg: RunConfig) -> list[str]:
    """Every setting of an `ascent train` config that the run would accept and ignore."""
    return (
        _reward_with_env(cfg)
        + _episode_fields(cfg)
        + validation_without_data(cfg)
        + truncation_without_truncate(cfg)
        + _kl_estimators(cfg)
        + _cluster_fields(cfg)
    )


def ignored_sft_settings(cfg: SFTConfig) -> list[str]:
    """Every setting of an `ascent sft` config that the run would accept and ignore."""
    return validation_without_data(cfg) + truncation_without_truncate(cfg)


def _reward_with_env(cfg: RunConfig) -> list[str]:
    source = cfg.rollout.source
    if not isinstance(source, EnvSourceConfig):
        return []
    return [
        f"reward.{name}={show_value(value)}: rollout.source env={source.env!r} scores its own episodes (the "
        f"rewards its step() returns), so reward.{name} is never used. To score with your reward function, "
        "call it in the environment's step() and return its value as StepResult.reward; or set "
        "rollout.source=prompt to train single-turn with reward.fn; or remove this setting."
        for name, value in _given(cfg.reward, REWARD_SCORING_FIELDS)
    ]


def _episode_fields(cfg: RunConfig) -> list[str]:
    r = cfg.rollout
    if r.multi_turn:
        return []
    return [
        f"rollout.{name}={show_value(value)}: only multi-turn episodes (an env or agent rollout.source) "
        "read it, and this run makes one response per prompt (rollout.source=prompt); set rollout.source: "
        "{name: env, env: ...} (or {name: agent, agent: ...}), or remove this setting."
        for name, value in _given(r, MULTI_TURN_FIELDS)
    ]


def validation_without_data(cfg: RunConfig | SFTConfig) -> list[str]:
    """Validation settings given while there is nothing to validate on (data.val_path unset)."""
    if cfg.data.val_path:
        return []
    given = [(f"data.{n}", v) for n, v in _given(cfg.data, ("max_val_prompts",))]
    given += [(n, v) for n, v in _given(cfg, ("val_every",))]
    rollout = getattr(cfg, "rollout", None)
    if rollout is not None:
        given += [
            (f"rollout.{n}", v)
            for n, v in _given(rollout, ("val_temperature", "val_samples_per_prompt", "val_pass_k"))
        ]
    return [
        f"{name}={show_value(value)}: there is no validation data (data.val_path is not set), so nothing is "
        "validated; set data.val_path to a .jsonl or .parquet of held-out prompts, or remove this setting."
        for name, value in given
    ]


def truncation_without_truncate(cfg: RunConfig | SFTConfig) -> list[str]:
    """data.truncation_side given while overlong prompts are not truncated (it only says which end
    `truncate` cuts)."""
    d = cfg.data
    if d.overlong_prompts == "truncate":
        return []
    return [
        f"data.truncation_side={show_value(value)}: only data.overlong_prompts=truncate cuts prompts, and "
        f"it is {d.overlong_prompts!r}, so no prompt is cut; set data.overlong_prompts=truncate, or remove "
        "this setting."
        for _, value in _given(d, ("truncation_side",))
    ]


def _kl_estimators(cfg: RunConfig) -> list[str]:
    """A KL estimator chosen for a KL term whose coefficient is 0 (the term, and its estimator, are off)."""
    a = cfg.algorithm
    pairs = (
        ("kl_estimator", "kl_loss_coef", "the KL loss"),
        ("kl_penalty_estimator", "kl_penalty_coef", "the KL reward penalty"),
    )
    return [
        f"algorithm.{name}={value!r}: only {term} uses it, and algorithm.{coef}=0 turns that off; set "
        f"algorithm.{coef} above 0, or remove it."
        for name, coef, term in pairs
        if getattr(a, coef) == 0
        for _, value in _given(a, (name,))
    ]


def _cluster_fields(cfg: RunConfig) -> list[str]:
    c = cfg.cluster
    out = []
    if c.backend == "inline" and c.weight_transport not in (
        "auto",
        "cuda_ipc",
    ):  # cuda_ipc: rules.py says why
        out.append(
            f"cluster.weight_transport={c.weight_transport}: with cluster.backend=inline the trainer and the "
            "engine share one process and its tensors, so no transport is used; remove it (or set "
            "cluster.backend=ray)."
        )
    if c.placement == "split" and not c.engine_sleeps:
        out.append(
            "cluster.engine_sleeps=false: only colocated placement puts the engine to sleep; with "
            "cluster.placement=split the engines have GPUs of their own and never sleep. Remove it (or use "
            "cluster.placement=colocated)."
        )
    return out
