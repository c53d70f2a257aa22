"""`ascent eval --reward-config FILE`: the reward of an evaluation from the `reward` section of a YAML (a train
config works): its function with `fn_weight`, a sequence-classification reward model (`reward.model`) and an
LLM judge (`reward.judge`), scored as in training (`ascent.orchestrator.sampling.Scorer`: each term is a
reward component of the episode and has its `reward/<name>/*` metrics).

Here every worker is inline (one process, as the rest of `ascent eval`): the reward model in its own worker,
the judge on the evaluated checkpoint's engine (`judge.model: policy`: the evaluated weights, which an
evaluation never changes) or on a reference engine of its own checkpoint (`policy@N`, a training run's
pinned version, is refused: an evaluation has no run). Failures are counted and none is
fatal, as for `--reward` (a failed judgement, one that did not parse or timed out, scores 0).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from ascent.cluster.inline import InlineWorkerGroup
from ascent.config.errors import ConfigError
from ascent.config.schema import RewardConfig
from ascent.messages import SamplingParams
from ascent.models.loading import load_tokenizer, resolve_device
from ascent.orchestrator.reward_models import ComponentScorer, JudgeScorer, ModelScorer
from ascent.orchestrator.specs import reward_model_spec
from ascent.orchestrator.workers import RewardModelWorker, RolloutWorker
from ascent.rewards.judge import JudgementCache, check_template, resolve_parser
from ascent.rollout import build_engine

log = logging.getLogger("ascent")


def read_reward_config(path: str) -> RewardConfig:
    """The `reward` section of the YAML at `path` (a whole train config, or a file holding only `reward:`);
    a file without one, or with a bad one, is a ConfigError naming --reward-config."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(
            f"--reward-config {path}: cannot read it as YAML ({err}); fix the path or file."
        ) from err
    section = doc.get("reward") if isinstance(doc, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(
            f"--reward-config {path}: it has no `reward:` mapping; give a train config or a file with "
            "`reward: {fn: ..., model: {...}, judge: {...}}`."
        )
    try:
        cfg = RewardConfig(**section)
    except ValueError as err:
        raise ConfigError(f"--reward-config {path}: its reward section is invalid:\n{err}") from err
    pin = cfg.judge.pinned_version if cfg.judge is not None else None
    if pin is not None:
        raise ConfigError(
            f"--reward-config {path}: reward.judge.model=policy@{pin} pins a training run's policy version, "
            "and an evaluation has no run: set reward.judge.model to `policy` (the evaluated checkpoint) or to "
            f"a checkpoint directory (that run's checkpoints/iter_{pin:06d} when it kept one)."
        )
    return cfg


class HeldEngine(RolloutWorker):
    """A RolloutWorker around an engine built already (the judge's), so the judge calls it as in training."""

    def __init__(self, engine: Any) -> None:  # no super().__init__: the engine exists
        self.engine, self.version, self._last_end, self.link = engine, 0, None, None


def eval_components(
    cfg: RewardConfig, model: str, tok: Any, engine: Any, device: str
) -> tuple[ComponentScorer, ...]:
    """The reward model's and the judge's scorers of `cfg` (none when it sets neither); `engine` and `tok`
    are the evaluated checkpoint's (`model`), the judge's when `judge.model` is `policy`. A failed judgement
    is never fatal here (max failure rate 1): it scores 0 and counts in `reward/judge/failures`."""
    out: list[ComponentScorer] = []
    if cfg.model is not None:
        spec = reward_model_spec(cfg.model, device)
        scorer = InlineWorkerGroup(RewardModelWorker, name="reward_model", init_kwargs={"spec": spec})
        out.append(ModelScorer(scorer, cfg.model.weight))
    if cfg.judge is not None:
        j = cfg.judge
        check_template(j.template)
        judge_tok, judge_engine = tok, engine
        if j.model != "policy" and Path(j.model).resolve() != Path(model).resolve():
            judge_tok = load_tokenizer(j.model, field="reward.judge.model")
            judge_engine = build_engine(
                "reference",
                model_path=j.model,
                device=resolve_device(device),
                eos_token_ids=[judge_tok.eos_token_id],
                pad_token_id=judge_tok.pad_token_id,
            )
        group = InlineWorkerGroup[RolloutWorker](HeldEngine, name="judge", init_args=(judge_engine,))
        params = SamplingParams(
            temperature=j.temperature, max_new_tokens=j.max_new_tokens, max_time_s=j.timeout_s
        )
        cache = JudgementCache(j.cache_size)
        out.append(
            JudgeScorer(group, judge_tok, j.template, resolve_parser(j.parser), params, cache, 1.0, j.weight)
        )
    return tuple(out)
