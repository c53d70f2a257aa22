"""Scored reward components beyond the reward function: a reward model's worker group and an LLM judge.

Each is a `ComponentScorer`: `name`, `weight`, and `score(inputs) -> ComponentScores` (one score per input,
the inputs whose scoring failed, and the component's metrics `reward/<name>/*`). `sampling.Scorer` adds
them to the reward function's score (`reward.fn_weight * fn + sum of weight * score`) and records each as
a reward component of the episode.

- `ModelScorer` (`reward.model`): the reward model's worker group (`workers.RewardModelWorker`) scores
  (prompt, response) texts in packed forwards, sharded over its workers.
- `JudgeScorer` (`reward.judge`): renders the judge template for each episode, asks a rollout worker group
  for the reply (the policy's replicas; a second reference engine of its own checkpoint that is never
  updated; or, `policy@N`, one holding the policy pinned at version N: `ascent.transport.pinned`), and
  parses it (`ascent.rewards.judge`). Repeated judgements (same prompt, response and answer)
  come from a cache keyed by their hash; a reply that does not parse, or that was still being written when
  the judgement's wall-clock budget ran out (`reward.judge.timeout_s`: the engine ends it as "abort"), costs
  that sample a score of 0.0 and counts as a failure, and past `reward.max_failure_rate` the batch raises
  `RewardFailureError`, as failed reward functions do. A failed judgement is not cached. The judge's
  generate call as a whole waits at most `cluster.worker_timeout_s` (the worker group's bound on every
  call).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ascent.cluster.base import WorkerGroup
from ascent.config.schema import RunConfig
from ascent.messages import SamplingParams
from ascent.models.loading import load_tokenizer
from ascent.orchestrator import batch as B
from ascent.orchestrator.setup import WorkerGroups
from ascent.orchestrator.workers import RewardModelWorker, RolloutWorker
from ascent.rewards import RewardFailureError, RewardInput
from ascent.rewards.judge import (
    JudgementCache,
    JudgeParseError,
    Parser,
    check_template,
    judgement_key,
    render_template,
    resolve_parser,
)

log = logging.getLogger("ascent")


@dataclass(frozen=True)
class ComponentScores:
    """One component's scores (aligned with the inputs), how many failed, and its metrics."""

    scores: list[float]
    failures: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


class ComponentScorer(Protocol):
    """A weighted reward component scored on a batch (see the module docstring)."""

    name: str
    weight: float

    def score(self, inputs: Sequence[RewardInput]) -> ComponentScores: ...


def summary(name: str, scores: Sequence[float], failures: int = 0) -> dict[str, float]:
    """`reward/<name>/mean`, `/std`, `/failures` and `/failure_rate` of one component's batch."""
    n = len(scores)
    return {
        f"reward/{name}/mean": statistics.fmean(scores) if n else 0.0,
        f"reward/{name}/std": statistics.pstdev(scores) if n else 0.0,
        f"reward/{name}/failures": float(failures),
        f"reward/{name}/failure_rate": failures / n if n else 0.0,
    }


@dataclass
class ModelScorer:
    """The reward model's worker group: every (prompt, response) pair scored, shards over its workers."""

    group: WorkerGroup[RewardModelWorker]
    weight: float = 1.0
    name: str = "reward_model"

    def score(self, inputs: Sequence[RewardInput]) -> ComponentScores:
        pairs = [(item.prompt, item.response) for item in inputs]
        shards = B.shard(pairs, self.group.num_workers)
        scores = [s for part in self.group.call_split(RewardModelWorker.score, shards) for s in part]
        return ComponentScores(scores, 0, summary(self.name, scores))


@dataclass
class JudgeScorer:
    """An LLM judge on a rollout worker group (see the module docstring). `tokenizer` is the judge model's:
    it renders the judge's message with its chat template and decodes the reply."""

    engine: WorkerGroup[RolloutWorker]
    tokenizer: Any
    template: str
    parser: Parser
    params: SamplingParams
    cache: JudgementCache
    max_failure_rate: float
    weight: float = 1.0
    name: str = "judge"
    seed: int = 0

    def score(self, inputs: Sequence[RewardInput]) -> ComponentScores:
        keys = [judgement_key(i.prompt, i.response, _answer(i)) for i in inputs]
        scores: list[float | None] = [self.cache.get(k) for k in keys]
        missing = [i for i, s in enumerate(scores) if s is None]
        errors: list[tuple[int, str]] = []
        for i, (reply, finish) in zip(missing, self._replies([inputs[i] for i in missing]), strict=True):
            try:
                if finish == "abort":
                    raise JudgeParseError(
                        f"the judgement timed out after reward.judge.timeout_s={self.params.max_time_s} s "
                        f"(reply so far {reply[:80]!r}); raise reward.judge.timeout_s or lower max_new_tokens"
                    )
                value = self.parser(reply)
            except JudgeParseError as err:
                errors.append((i, str(err)))
                value = 0.0
            else:
                self.cache.put(keys[i], value)
            scores[i] = value
        done = [0.0 if s is None else s for s in scores]
        metrics = summary(self.name, done, len(errors))
        metrics[f"reward/{self.name}/cache_hit_rate"] = self.cache.take_hit_rate()
        self._check(errors, inputs)
        return ComponentScores(done, len(errors), metrics)

    def _replies(self, inputs: Sequence[RewardInput]) -> list[tuple[str, str]]:
        """(the judge's reply, its finish reason) for each input's rendered template (one generate call over the
        group)."""
        if not inputs:
            return []
        prompts = [self._prompt_ids(item) for item in inputs]
        self.seed += len(prompts)  # fresh draws for a later batch (greedy judges do not care)
        requests = B.make_requests(prompts, self.params, self.seed)
        shards = B.shard(requests, self.engine.num_workers)
        rollouts = self.engine.call_split(RolloutWorker.generate, shards)
        generations = [row[0] for r in rollouts for row in r.generations]
        return [
            (str(self.tokenizer.decode(g.token_ids, skip_special_tokens=True)), g.finish_reason)
            for g in generations
        ]

    def _prompt_ids(self, item: RewardInput) -> list[int]:
        text = render_template(self.template, item.prompt, item.response, _answer(item))
        messages = [{"role": "user", "content": text}]
        rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(rendered, add_special_tokens=False))

    def _check(self, errors: list[tuple[int, str]], inputs: Sequence[RewardInput]) -> None:
        """Log the first failures; raise past `max_failure_rate` (the share of this batch)."""
        for i, error in errors[:5]:
            log.warning("reward.judge failed on row %d: %s", inputs[i].row_id + 1, error)
        if errors and len(errors) / len(inputs) > self.max_failure_rate:
            i, error = errors[0]
            raise RewardFailureError(
                f"{len(errors)} of {len(inputs)} judgements failed: no score parsed, or timed out "
                f"({len(errors) / len(inputs):.1%}, over reward.max_failure_rate={self.max_failure_rate}); first "
                f"on row {inputs[i].row_id + 1}: {error}. Fix reward.judge.template or reward.judge.parser, "
                "raise reward.judge.timeout_s, or raise reward.max_failure_rate.",
                len(errors),
                len(inputs),
                inputs[i].row_id + 1,
                error,
            )


def _answer(item: RewardInput) -> str:
    answer = item.metadata.get("answer")
    return "" if answer is None else str(answer)


def build_scorers(cfg: RunConfig, groups: WorkerGroups, policy_tokenizer: Any) -> tuple[ComponentScorer, ...]:
    """The run's reward components besides `reward.fn`: the reward model's and the judge's scorers (once,
    at setup, over the worker groups `build_worker_groups` made for them)."""
    r = cfg.reward
    scorers: list[ComponentScorer] = []
    if r.model is not None:
        if groups.reward_model is None:
            raise ValueError("build_scorers: reward.model is set but setup built no reward_model group")
        scorers.append(ModelScorer(groups.reward_model, r.model.weight))
    if r.judge is not None:
        j = r.judge
        check_template(j.template)
        own = j.model != "policy"  # a checkpoint, or the policy pinned (policy@N), in a group of its own
        engine = groups.judge if own else groups.rollout
        if engine is None:
            raise ValueError("build_scorers: reward.judge has an engine of its own but setup built no group")
        checkpoint = own and j.pinned_version is None  # its own tokenizer; policy@N is the policy's
        tokenizer = (
            load_tokenizer(j.model, cfg.model.trust_remote_code, "reward.judge.model") if checkpoint else None
        )
        params = SamplingParams(
            temperature=j.temperature, max_new_tokens=j.max_new_tokens, max_time_s=j.timeout_s
        )
        judge = JudgeScorer(
            engine,
            tokenizer or policy_tokenizer,
            j.template,
            resolve_parser(j.parser),
            params,
            JudgementCache(j.cache_size),
            r.max_failure_rate,
            j.weight,
            seed=cfg.seed,
        )
        scorers.append(judge)
    return tuple(scorers)
