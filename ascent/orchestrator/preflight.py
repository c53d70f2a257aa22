"""Checks before a run loads anything heavy: each catches a mistake that would otherwise surface as a raw
traceback deep inside a worker, or not at all (a run that trains on nonsense without a word).

Called by `run_training` (and partly by `run_sft` and `ascent eval`) right after the data is rendered: the
model directory and its weight files are whole, the tokenizer fits the model's vocabulary, stop tokens
exist, prompts plus responses fit the model's context, a tensor-parallel fast engine can split the model,
a distillation teacher shares the student's tokenizer, and plug-in import paths resolve (group hooks'
included). (The trackers are checked earlier, when `ascent.tracking.open_tracking` opens them.) Every
failure names the field or file and the fix.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ascent import algorithms as A
from ascent.algorithms import option_names
from ascent.config import AlgorithmConfig, ConfigError, RunConfig
from ascent.config.choices import PluginChoice
from ascent.config.sources import AgentSourceConfig
from ascent.data.prompts import PromptItem
from ascent.envs.openai_agents import load_agent
from ascent.models.files import damaged_weight_file
from ascent.models.loading import TOKENIZER_FILES, ModelLoadError, load_tokenizer
from ascent.orchestrator.group_hooks import build_group_hooks
from ascent.plugins import resolve

if TYPE_CHECKING:  # transformers is imported where the tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("ascent")


def model_config(path: str | Path, field: str = "model.path") -> dict[str, Any]:
    """The checkpoint's config.json as a dict; errors name the directory and what is missing."""
    p = Path(path)
    if p.is_dir() and not any(p.iterdir()):
        raise ModelLoadError(
            f"{field}={str(path)!r} is an empty directory; point it at a Hugging Face checkpoint "
            "(config.json, "
            "*.safetensors and the tokenizer files), e.g. one written by `save_pretrained`."
        )
    file = p / "config.json"
    if not file.is_file():
        return {}  # load_model / load_tokenizer say what is missing, in their own words
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{field}={str(path)!r}: config.json is not valid JSON ({err}).") from err


def check_weight_files(path: str | Path, field: str = "model.path") -> None:
    """Raise naming the first truncated or corrupt *.safetensors file of a checkpoint directory."""
    damaged = damaged_weight_file(Path(path))
    if damaged:
        raise ModelLoadError(
            f"{field}={str(path)!r}: {damaged[0].name} is {damaged[1]}; the weights are damaged (an "
            "interrupted copy or save?). Copy the checkpoint again."
        )


def check_vocab(tokenizer: Any, config: dict[str, Any], path: str) -> int:
    """The model's vocabulary size; raise if the tokenizer has ids the model's embedding cannot look up."""
    vocab = int(config.get("vocab_size") or len(tokenizer))
    if len(tokenizer) > vocab:
        raise ModelLoadError(
            f"model.tokenizer_path: the tokenizer has {len(tokenizer)} tokens but the model at {path!r} has "
            f"vocab_size={vocab}, so ids {vocab}..{len(tokenizer) - 1} would index past its embedding; "
            "use the "
            "tokenizer that came with the model (or resize the model's embeddings and save it)."
        )
    return vocab


def check_stop_tokens(stop_token_ids: list[int], vocab: int, field: str = "rollout.stop_token_ids") -> None:
    bad = [t for t in stop_token_ids if not 0 <= t < vocab]
    if bad:
        raise ConfigError(
            f"{field}={stop_token_ids}: {bad} outside the vocabulary (0..{vocab - 1}); "
            "use ids of real tokens (e.g. tokenizer.convert_tokens_to_ids('<|im_end|>'))."
        )


def check_context(config: dict[str, Any], longest_prompt: int, max_new_tokens: int, prompt_cap: int) -> None:
    """Raise when the longest prompt plus `max_new_tokens` exceeds the model's position limit; warn when the
    configured caps could (positions past the limit are extrapolated: the model's outputs are garbage)."""
    limit = config.get("max_position_embeddings")
    if not limit:
        return
    if longest_prompt + max_new_tokens > limit:
        raise ConfigError(
            f"rollout.max_new_tokens={max_new_tokens}: the longest prompt has {longest_prompt} tokens, and "
            f"together they exceed the model's max_position_embeddings={limit}; lower rollout.max_new_tokens "
            f"to {max(limit - longest_prompt, 1)} or less, or lower data.max_prompt_tokens."
        )
    if prompt_cap + max_new_tokens > limit:
        log.warning(
            "data.max_prompt_tokens=%d + rollout.max_new_tokens=%d exceed the model's "
            "max_position_embeddings="
            "%d; today's prompts fit (longest %d tokens), longer ones would not.",
            prompt_cap,
            max_new_tokens,
            limit,
            longest_prompt,
        )


def check_plugins(algorithm: AlgorithmConfig) -> None:
    """Resolve every algorithm name or import path now, so a typo fails at start-up with the field named."""

    registries: dict[str, Mapping[str, Callable[..., Any]]] = {
        "advantage": A.ADVANTAGE_ESTIMATORS,
        "policy_loss": A.POLICY_LOSSES,
        "loss_aggregation": A.LOSS_AGGREGATIONS,
        "kl_estimator": A.KL_ESTIMATORS,
        "kl_penalty_estimator": A.KL_ESTIMATORS,
    }
    problems, resolved = [], {}
    for name, registry in registries.items():
        value = getattr(algorithm, name)
        value = value if isinstance(value, str) else value.name  # a choice: policy_loss, advantage
        try:
            resolved[name] = resolve(registry, value, f"algorithm.{name}")
        except ValueError as err:  # names the field, the value and the fix
            problems.append(str(err))
    if not problems:
        problems = unused_options(algorithm, resolved["advantage"], resolved["policy_loss"])
    if problems:
        raise ConfigError(problems)


def unused_options(
    algorithm: AlgorithmConfig, estimator: Callable[..., Any], loss: Callable[..., Any]
) -> list[str]:
    """`algorithm.options` entries that no plug-in among the advantage estimator and the policy loss takes (a
    typo would otherwise be ignored silently). Only a plug-in gets options, and only under names that are not
    settings of the section (the loader refuses options that name a built-in's setting)."""

    names: list[set[str]] = []
    for choice, fn in ((algorithm.advantage, estimator), (algorithm.policy_loss, loss)):
        if isinstance(choice, PluginChoice):
            taken = option_names(fn)
            if taken is None:  # a plug-in takes **kwargs: anything may be meant for it
                return []
            names.append(taken - set(type(algorithm).model_fields))
    known = sorted(set().union(*names))
    where = f"advantage={algorithm.advantage.name!r} nor policy_loss={algorithm.policy_loss.name!r}"
    who = "the plug-ins take" if len(names) > 1 else "the plug-in takes"
    takes = f"{who} {', '.join(known) or 'no options'}" if names else "only a plug-in takes options"
    return [
        f"algorithm.options.{key}={value!r}: neither {where} takes {key!r}; {takes}. Fix the name, or "
        "drop it."
        for key, value in algorithm.options.items()
        if key not in known
    ]


def check_model(path: str, tokenizer: PreTrainedTokenizerBase) -> int:
    """Model directory, weight files and vocabulary together; returns the model's vocabulary size."""
    config = model_config(path)
    check_weight_files(path)
    return check_vocab(tokenizer, config, path)


def check_teacher(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase, vocab: int) -> None:
    """A distillation teacher (`algorithm.teacher`) is a whole checkpoint whose vocabulary is the
    student's: the same vocab_size and, when it has tokenizer files, the same token -> id map (its logprob of
    token id k must be about the token the student sampled as k)."""
    teacher, field = cfg.algorithm.teacher, "algorithm.teacher"
    if teacher is None or cfg.algorithm.advantage.name != "distill":
        return
    config = model_config(teacher, field)
    check_weight_files(teacher, field)
    student = cfg.model.tokenizer_path or cfg.model.path
    differs = None
    teacher_vocab = int(config.get("vocab_size") or 0)
    if teacher_vocab != vocab:
        differs = f"its vocab_size is {teacher_vocab}, the student's {vocab}"
    elif any((Path(teacher) / name).is_file() for name in TOKENIZER_FILES):
        theirs = load_tokenizer(teacher, cfg.model.trust_remote_code, field).get_vocab()
        if theirs != tokenizer.get_vocab():
            differs = f"its tokenizer maps tokens to other ids ({len(theirs)} tokens, the student's {len(tokenizer)})"
    if differs is not None:
        raise ConfigError(
            f"{field}={teacher!r}: the teacher does not share the student's tokenizer ({student!r}): {differs}. "
            "Distillation compares the two models' logprobs of the same token ids; use a teacher trained with "
            "the student's tokenizer (the same model family), or a student with the teacher's."
        )


def check_tensor_parallel(cfg: RunConfig) -> None:
    """rollout.tensor_parallel > 1 (fast engine): the ranks must split the model's heads and MLP widths (every
    expert's for a mixture of experts) evenly; refused here, naming the field, not in the replica's worker.
    A model the fast engine does not run at all is left to the engine's own error."""
    tp = cfg.rollout.tensor_parallel
    if tp <= 1 or cfg.rollout.engine != "fast":
        return
    from transformers import AutoConfig  # deferred: transformers and the fast engine, slow to import

    from ascent.rollout.fast.spec import spec_from_config  # deferred: as above
    from ascent.rollout.fast.tp_shard import check_shardable  # deferred: as above

    hf = AutoConfig.from_pretrained(
        cfg.model.path, local_files_only=True, trust_remote_code=cfg.model.trust_remote_code
    )
    try:
        spec = spec_from_config(hf)
    except ValueError:
        return
    try:
        check_shardable(spec, tp)
    except ValueError as err:  # names rollout.tensor_parallel, the model's size and the fix
        raise ConfigError(str(err)) from err


def check_run(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase, prompts: list[PromptItem]) -> None:
    """Every pre-flight check of `ascent train`, given the tokenizer and the rendered training prompts."""
    vocab = check_model(cfg.model.path, tokenizer)
    check_stop_tokens(list(cfg.rollout.stop_token_ids), vocab)
    check_stop_tokens(list(cfg.rollout.action_token_ids), vocab, "rollout.action_token_ids")
    longest = max((len(p.prompt_ids) for p in prompts), default=0)
    check_context(
        model_config(cfg.model.path), longest, cfg.rollout.response_budget, cfg.data.max_prompt_tokens
    )
    check_teacher(cfg, tokenizer, vocab)
    check_tensor_parallel(cfg)
    check_plugins(cfg.algorithm)
    build_group_hooks(cfg.reward.group_hooks)  # resolves each hook: a bad name or import path fails now
    if isinstance(cfg.rollout.source, AgentSourceConfig):  # a bad import path fails before anything heavy
        load_agent(cfg.rollout.source.agent)
