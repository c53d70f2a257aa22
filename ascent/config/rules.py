"""Cross-field rules of the run config: batch sizes that divide, algorithm choices that fit together.

Each rule names the field, the value and the fix, in the style of the design:
`rollout.samples_per_prompt=1: GRPO compares samples within a group; set it to 2 or more.`
All broken rules are reported at once. Settings that the rest of the config makes the run ignore are refused
too (`ignored.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ascent.config.action_head import action_head_rules
from ascent.config.choices import GrpoAdvantage
from ascent.config.ignored import ignored_run_settings, ignored_sft_settings
from ascent.config.replay import replay_rules
from ascent.config.reward_models import reward_model_rules
from ascent.config.sources import PromptSourceConfig

if TYPE_CHECKING:
    from ascent.config.schema import RunConfig, SFTConfig

# Registry names of ascent.algorithms, repeated here because config imports without torch
# (tests/unit/algorithms/test_alg_registry_config.py checks they match the registries; the policy losses'
# and advantage estimators' names are the keys of choices.POLICY_LOSS_CHOICES and ADVANTAGE_CHOICES).
GROUP_ESTIMATORS = {
    "grpo",
    "rloo",
    "opo",
    "gpg",
    "grpo_passk",
    "passk",
    "reinforce_pp_baseline",
    "optimal_token_baseline",
}
CRITIC_ESTIMATORS = {"gae"}
TOKEN_REWARD_ESTIMATORS = {"gae", "reinforce_pp", "reinforce_pp_baseline", "remax", "optimal_token_baseline"}
ADVANTAGE_ESTIMATORS = GROUP_ESTIMATORS | TOKEN_REWARD_ESTIMATORS | {"distill"}
LOSS_AGGREGATIONS = {
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
}
KL_ESTIMATORS = {"k1", "k2", "k3", "k1+", "k3+"}
ENGINES = {"reference", "fast"}


def check_run_config(cfg: RunConfig) -> None:
    """Raise ValueError listing every broken cross-field rule of `cfg` (nothing when all hold)."""
    problems = _batch_rules(cfg) + _algorithm_rules(cfg) + ignored_run_settings(cfg) + reward_model_rules(cfg)
    problems += replay_rules(cfg) + _adapter_publication_rules(cfg) + action_head_rules(cfg)
    problems += _mps_rules(cfg)
    if problems:
        raise ValueError("\n".join(problems))


# `train` fields that only the RL loop reads: an SFT step is `batch_size` pairs, one pass, no old logprobs.
RL_ONLY_TRAIN_FIELDS = (
    "epochs_per_rollout",
    "trajectories_per_update",
    "shuffle_mini_batches",
    "old_logprobs",
)
RL_ONLY_CLUSTER_FIELDS = (
    "num_rollout_workers",
    "placement",
    "engine_sleeps",
    "weight_transport",
    "weight_bucket_mb",
    "weight_sync_timeout_s",
    "trainer_gpus",
    "rollout_gpus",
    "reward_model_gpus",
    "mps",
)


def check_sft_config(cfg: SFTConfig) -> None:
    """Raise ValueError naming every RL-only `train` field an `ascent sft` config changes (SFT ignores
    them)."""
    problems = [
        f"{section}.{name}={getattr(getattr(cfg, section), name)!r}: `ascent sft` does not read this RL "
        "field (an SFT optimizer step is `batch_size` pairs over the trainer ranks, `epochs` passes over the "
        "data); remove it."
        for section, names in (("train", RL_ONLY_TRAIN_FIELDS), ("cluster", RL_ONLY_CLUSTER_FIELDS))
        for name in names
        # a resolved config.yaml lists the defaults
        if getattr(getattr(cfg, section), name) != type(getattr(cfg, section)).model_fields[name].default
    ]
    if cfg.cluster.backend == "inline" and cfg.cluster.num_trainer_workers > 1:
        problems.append(
            f"cluster.num_trainer_workers={cfg.cluster.num_trainer_workers}: several trainer ranks run as "
            "Ray actors; set cluster.backend=ray (a local Ray cluster works on one machine)."
        )
    if cfg.batch_size % cfg.cluster.num_trainer_workers:
        problems.append(
            f"batch_size={cfg.batch_size}: each batch is split evenly over "
            f"cluster.num_trainer_workers={cfg.cluster.num_trainer_workers} ranks; make it a multiple of "
            "that."
        )
    problems += sequence_parallel_rules(cfg.train.sequence_parallel, cfg.cluster.num_trainer_workers)
    problems += ignored_sft_settings(cfg)
    if problems:
        raise ValueError("\n".join(problems))


def _batch_rules(cfg: RunConfig) -> list[str]:
    r, t, c = cfg.rollout, cfg.train, cfg.cluster
    per_step = r.prompts_per_step * r.samples_per_prompt
    out = []
    if per_step % t.trajectories_per_update:
        out.append(
            f"train.trajectories_per_update={t.trajectories_per_update}: one iteration makes "
            f"rollout.prompts_per_step x rollout.samples_per_prompt = {per_step} trajectories, which must "
            f"split into whole mini-batches; set it to a divisor of {per_step} (e.g. "
            f"{_divisor_near(per_step, t.trajectories_per_update)})."
        )
    if t.trajectories_per_update % c.num_trainer_workers:
        out.append(
            f"cluster.num_trainer_workers={c.num_trainer_workers}: each mini-batch of "
            f"train.trajectories_per_update={t.trajectories_per_update} trajectories is split evenly over "
            "the trainer workers; make the worker count a divisor of it."
        )
    colocated_gpus = c.backend == "ray" and c.placement == "colocated" and c.gpus_per_worker > 0
    if colocated_gpus and c.num_rollout_workers != c.num_trainer_workers:
        out.append(
            f"cluster.num_rollout_workers={c.num_rollout_workers}: with cluster.placement=colocated each "
            "rollout replica shares a GPU bundle with one trainer rank; set it to "
            f"cluster.num_trainer_workers={c.num_trainer_workers}, or use cluster.placement=split."
        )
    out += _transport_rules(cfg) + _placement_rules(cfg)
    out += sequence_parallel_rules(t.sequence_parallel, c.num_trainer_workers)
    budget = "rollout.source.max_episode_tokens" if r.multi_turn else "rollout.max_new_tokens"
    needed = cfg.data.max_prompt_tokens + r.response_budget
    if t.max_tokens_per_micro_batch < needed:
        out.append(
            f"train.max_tokens_per_micro_batch={t.max_tokens_per_micro_batch}: the longest trajectory can "
            f"have data.max_prompt_tokens + {budget} = {needed} tokens and must fit one micro-batch; "
            f"raise it to at least {needed}."
        )
    return out


def sequence_parallel_rules(degree: int, trainers: int) -> list[str]:
    """`train.sequence_parallel` splits the trainer ranks into groups of that many (RL and SFT alike); the
    model's heads are checked where the model is known (`ascent doctor`, the trainer ranks)."""
    if trainers % degree == 0:
        return []
    return [
        f"train.sequence_parallel={degree}: groups of {degree} trainer ranks share each packed sequence, "
        f"but cluster.num_trainer_workers={trainers} does not split into them; set "
        f"cluster.num_trainer_workers to a multiple of {degree} (cluster.backend=ray), or lower "
        "train.sequence_parallel."
    ]


def _transport_rules(cfg: RunConfig) -> list[str]:
    c = cfg.cluster
    if c.weight_transport != "cuda_ipc":
        return []
    if c.backend != "ray" or c.gpus_per_worker == 0 or c.device == "cpu":
        return [
            "cluster.weight_transport=cuda_ipc: CUDA IPC links Ray actors on GPUs (cluster.backend=ray, "
            "cluster.gpus_per_worker > 0); use broadcast or auto."
        ]
    if c.placement == "split":
        return [
            "cluster.weight_transport=cuda_ipc: CUDA IPC shares a trainer rank's GPU memory with the replica "
            "on the same GPU, but cluster.placement=split gives the replicas GPUs of their own; use "
            "broadcast (NCCL between GPUs) or auto."
        ]
    if c.num_rollout_workers != c.num_trainer_workers:
        return [
            f"cluster.weight_transport=cuda_ipc: trainer rank i serves replica i, so "
            f"cluster.num_rollout_workers={c.num_rollout_workers} must equal "
            f"cluster.num_trainer_workers={c.num_trainer_workers}; use broadcast for other counts."
        ]
    return []


def _placement_rules(cfg: RunConfig) -> list[str]:
    """Per-component GPU counts are read only where each component has GPUs of its own (split on Ray);
    a replica's GPUs hold its tensor-parallel ranks; tensor parallelism is the fast engine's."""
    c, tp = cfg.cluster, cfg.rollout.tensor_parallel
    own = {
        "trainer_gpus": c.trainer_gpus,
        "rollout_gpus": c.rollout_gpus,
        "reward_model_gpus": c.reward_model_gpus,
    }
    out = []
    if not (c.backend == "ray" and c.placement == "split"):
        out += [
            f"cluster.{name}={value:g}: only cluster.backend=ray with cluster.placement=split gives components "
            "GPUs of their own (colocated groups share bundles of cluster.gpus_per_worker); remove it or set "
            "cluster.placement=split."
            for name, value in own.items()
            if value is not None
        ]
    elif c.rollout_gpus is not None and c.rollout_gpus < tp:
        out.append(
            f"cluster.rollout_gpus={c.rollout_gpus:g}: each replica's rollout.tensor_parallel={tp} ranks take a "
            f"GPU each; set it to at least {tp}."
        )
    if tp > 1 and c.backend == "ray" and c.placement == "colocated" and c.gpus_per_worker > 0:
        out.append(
            f"rollout.tensor_parallel={tp}: a colocated replica shares a fraction of one GPU bundle with a "
            "trainer rank and sees no GPUs for its other ranks; use cluster.placement=split."
        )
    if tp > 1 and cfg.rollout.engine != "fast":
        out.append(
            f"rollout.tensor_parallel={tp}: only the fast engine runs tensor-parallel; set rollout.engine=fast "
            "or tensor_parallel=1."
        )
    return out


def _mps_rules(cfg: RunConfig) -> list[str]:
    """cluster.mps=on starts a daemon on the driver's node for Ray workers on GPUs; anything else cannot use
    it (`auto` quietly skips those runs)."""
    c = cfg.cluster
    if c.mps != "on":
        return []
    if c.backend != "ray":
        return [
            "cluster.mps=on: MPS lets several processes share a GPU at once, and backend=inline runs one; "
            "set cluster.backend=ray or cluster.mps=auto."
        ]
    if c.device == "cpu" or c.gpus_per_worker <= 0:
        return [
            "cluster.mps=on: the workers have no GPUs (cluster.device=cpu or cluster.gpus_per_worker=0); "
            "give them GPUs or set cluster.mps=auto."
        ]
    if c.address:
        return [
            f"cluster.mps=on: ascent would start the daemon on this node only, and cluster.address="
            f"{c.address!r} joins a cluster of other nodes too; run `nvidia-cuda-mps-control -d` on each node "
            "before `ray start` (its workers then use it) and leave cluster.mps=auto."
        ]
    return []


def _adapter_publication_rules(cfg: RunConfig) -> list[str]:
    """model.lora.publish=adapter: the engines merge the adapter into base weights they keep, which a
    sleeping colocated fast engine frees; a sharded trainer and a tensor-parallel replica do not send or
    take adapters yet."""
    lora, c = cfg.model.lora, cfg.cluster
    if lora.publish != "adapter":
        return []
    field = "model.lora.publish=adapter"
    out = []
    if lora.rank == 0:
        out.append(f"{field}: model.lora.rank=0 trains no adapter; set a rank or publish=merged.")
    if c.placement == "colocated" and cfg.rollout.engine == "fast" and c.engine_sleeps:
        out.append(
            f"{field}: a colocated fast engine frees its weights while the trainer updates and needs the "
            "whole model back; set cluster.placement=split or cluster.engine_sleeps=false, or publish=merged."
        )
    if cfg.train.sharding == "fsdp":
        out.append(
            f"{field}: a sharded (train.sharding=fsdp) trainer publishes merged weights; set publish=merged."
        )
    if cfg.rollout.quantization != "none":
        out.append(
            f"{field}: an FP8 engine (rollout.quantization={cfg.rollout.quantization}) holds no full-precision "
            "base to merge adapters into; set publish=merged or rollout.quantization=none."
        )
    if cfg.rollout.tensor_parallel > 1:
        out.append(
            f"{field}: a tensor-parallel replica (rollout.tensor_parallel={cfg.rollout.tensor_parallel}) takes "
            "merged weights; set publish=merged."
        )
    return out


def _algorithm_rules(cfg: RunConfig) -> list[str]:
    return (
        _name_rules(cfg)
        + _estimator_rules(cfg)
        + _distill_rules(cfg)
        + _kl_rules(cfg)
        + _loss_rules(cfg)
        + _sampling_rules(cfg)
        + _env_rules(cfg)
        + _data_rules(cfg)
    )


def _data_rules(cfg: RunConfig) -> list[str]:
    """A system prompt needs the chat template and a prompt source; each validation k fits the samples."""
    d, r = cfg.data, cfg.rollout
    out = []
    if d.system_prompt is not None and not d.chat_template:
        out.append(
            "data.system_prompt is set, but data.chat_template=false encodes prompts as raw text with no "
            "system message; set data.chat_template=true or remove data.system_prompt."
        )
    if d.system_prompt is not None and not isinstance(r.source, PromptSourceConfig):
        out.append(
            f"data.system_prompt is set, but rollout.source={r.source.name} writes its own prompts; put the "
            "system message in the environment's reset() (or the agent) or remove data.system_prompt."
        )
    bad = [k for k in r.val_pass_k if not 1 <= k <= r.val_samples_per_prompt]
    if bad:
        out.append(
            f"rollout.val_pass_k={r.val_pass_k}: pass@k and mean@k need 1 <= k <= "
            f"rollout.val_samples_per_prompt={r.val_samples_per_prompt} ({bad} do not fit); raise "
            "rollout.val_samples_per_prompt or drop those k."
        )
    return out


def _env_rules(cfg: RunConfig) -> list[str]:
    """What multi-turn episodes (an environment or an agent) do not support yet (each says what to set)."""
    r, a = cfg.rollout, cfg.algorithm
    if isinstance(r.source, PromptSourceConfig):
        return []
    src = f"rollout.source={r.source.name}"
    out = []
    if a.advantage.name == "remax":
        out.append(
            f"algorithm.advantage='remax': its greedy baseline is single-turn; with {src} pick "
            "grpo, rloo or another group estimator."
        )
    if a.overlong_buffer:
        out.append(
            f"algorithm.overlong_buffer={a.overlong_buffer}: the overlong penalty is single-turn; set "
            f"it to 0 with {src} (rollout.source.max_episode_tokens bounds an episode)."
        )
    if r.source.max_episode_tokens < r.max_new_tokens:
        out.append(
            f"rollout.source.max_episode_tokens={r.source.max_episode_tokens}: an episode must hold at least "
            f"one turn of rollout.max_new_tokens={r.max_new_tokens}; raise it."
        )
    return out


def _unknown(field: str, value: str, names: set[str]) -> list[str]:
    if value in names or ":" in value:
        return []
    return [
        f"{field}={value!r}: unknown; use one of {', '.join(sorted(names))} (or an import path "
        "`pkg.module:function`)."
    ]


def _name_rules(cfg: RunConfig) -> list[str]:
    a = cfg.algorithm
    engine = cfg.rollout.engine
    engine_rule = (
        []
        if engine in ENGINES
        else [f"rollout.engine={engine!r}: unknown; use one of {', '.join(sorted(ENGINES))}."]
    )
    return (
        engine_rule
        + _unknown("algorithm.loss_aggregation", a.loss_aggregation, LOSS_AGGREGATIONS)
        + _unknown("algorithm.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
        + _unknown("algorithm.kl_penalty_estimator", a.kl_penalty_estimator, KL_ESTIMATORS)
    )


def _distill_rules(cfg: RunConfig) -> list[str]:
    """advantage=distill and algorithm.teacher come together."""
    a = cfg.algorithm
    if a.advantage.name == "distill" and not a.teacher:
        return [
            "algorithm.advantage=distill: on-policy distillation needs a teacher; set algorithm.teacher to its "
            "checkpoint directory (a model sharing model.path's tokenizer)."
        ]
    if a.teacher and a.advantage.name != "distill":
        return [
            f"algorithm.teacher={a.teacher!r}: only advantage=distill reads it (advantage="
            f"{a.advantage.name}); set algorithm.advantage=distill or remove algorithm.teacher."
        ]
    return []


def _estimator_rules(cfg: RunConfig) -> list[str]:
    a, r = cfg.algorithm, cfg.rollout
    adv = a.advantage.name
    out = []
    if adv in GROUP_ESTIMATORS and r.samples_per_prompt < 2:
        out.append(
            f"rollout.samples_per_prompt={r.samples_per_prompt}: {adv.upper()} compares samples within "
            "a group; set it to 2 or more."
        )
    if adv in CRITIC_ESTIMATORS and a.use_critic is False:
        out.append(
            "algorithm.use_critic=false: advantage=gae needs a critic; set use_critic to true (or null) or "
            "choose grpo/rloo/reinforce_pp."
        )
    if a.use_critic and adv not in CRITIC_ESTIMATORS and ":" not in adv:
        out.append(
            f"algorithm.use_critic=true: advantage={adv} does not use a critic; set advantage=gae "
            "or use_critic to null."
        )
    if adv in GROUP_ESTIMATORS and r.temperature == 0:
        out.append(
            "rollout.temperature=0: greedy decoding gives every sample of a group the same response and "
            f"reward, so {adv.upper()}'s advantages (and the gradient) are all 0; sample with a temperature "
            "above 0 (1.0 is usual)."
        )
    if adv == "remax" and r.temperature == 0:
        out.append(
            "rollout.temperature=0: ReMax subtracts the reward of the greedy response, which then equals "
            "every sample (all advantages 0); sample with a temperature above 0."
        )
    if isinstance(a.advantage, GrpoAdvantage) and a.advantage.std_over_batch and not a.advantage.scale_by_std:
        out.append(
            "algorithm.advantage.std_over_batch=true needs algorithm.advantage.scale_by_std=true (there is "
            "no std to take over the batch otherwise); set one of them differently."
        )
    if a.critic_warmup_iterations and a.critic_warmup_iterations >= cfg.iterations:
        out.append(
            f"algorithm.critic_warmup_iterations={a.critic_warmup_iterations}: the run has only "
            f"iterations={cfg.iterations}, so the policy would never train; lower it."
        )
    return out


def _kl_rules(cfg: RunConfig) -> list[str]:
    a = cfg.algorithm
    out = []
    if a.kl_penalty_coef > 0 and a.advantage.name in GROUP_ESTIMATORS - TOKEN_REWARD_ESTIMATORS:
        out.append(
            f"algorithm.kl_penalty_coef={a.kl_penalty_coef}: advantage={a.advantage.name} ignores per-token "
            "rewards, so the KL penalty would do nothing; use kl_loss_coef instead, or "
            "advantage=reinforce_pp/gae."
        )
    if a.kl_target is not None and a.kl_penalty_coef == 0:
        out.append(
            f"algorithm.kl_target={a.kl_target}: the adaptive controller scales kl_penalty_coef, which is 0; "
            "set kl_penalty_coef > 0 (its starting value) or kl_target to null."
        )
    return out


def _loss_rules(cfg: RunConfig) -> list[str]:
    a = cfg.algorithm
    out = []
    low, high = a.rollout_correction_threshold_low, a.rollout_correction_threshold
    if low is not None and a.rollout_correction != "mis":
        out.append(
            f"algorithm.rollout_correction_threshold_low={low}: only rollout_correction=mis uses a lower "
            f"bound (it is {a.rollout_correction}); set it to null."
        )
    elif low is not None and low >= high:
        out.append(
            f"algorithm.rollout_correction_threshold_low={low}: must be below rollout_correction_threshold="
            f"{high} (and usually below 1)."
        )
    return out


def _sampling_rules(cfg: RunConfig) -> list[str]:
    a, r = cfg.algorithm, cfg.rollout
    out = []
    if a.dynamic_sampling and r.samples_per_prompt < 2:
        out.append(
            f"rollout.samples_per_prompt={r.samples_per_prompt}: dynamic sampling keeps groups whose rewards "
            "differ, and a group of one never does; set it to 2 or more."
        )
    if a.overlong_buffer >= r.max_new_tokens:
        out.append(
            f"algorithm.overlong_buffer={a.overlong_buffer}: the penalty zone must be shorter than "
            f"rollout.max_new_tokens={r.max_new_tokens}; lower it (DAPO used a quarter of the budget)."
        )
    return out


def _divisor_near(n: int, want: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - want), -d))
