"""Turning prompts into requests, generations into groups of episodes, and scored episodes into train samples.

These are the data-shaping steps of one iteration, kept out of the loop so `loop.py` reads as the loop only.
Advantages are computed on the controller in padded [B, T] layout (small: one float per response token).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import llguidance
import numpy as np
import torch

from ascent.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, options_for, reverse_kl
from ascent.algorithms.advantage_types import turn_end_rewards
from ascent.config.rollout import RolloutConfig
from ascent.config.schema import AlgorithmConfig
from ascent.messages import (
    Episode,
    Generation,
    GenerationRequest,
    Group,
    ImageInput,
    SamplingParams,
    TrainSample,
    flatten,
)
from ascent.plugins import resolve


def sampling_params(rollout_cfg: RolloutConfig, *, validation: bool = False) -> SamplingParams:
    """The engine's sampling parameters from the rollout config section (training or validation)."""
    r = rollout_cfg
    lark = [r.grammar] if isinstance(r.grammar, str) else list(r.grammar or [])
    grammars = [llguidance.LLMatcher.grammar_from_lark(g) for g in lark]
    return SamplingParams(
        temperature=r.val_temperature if validation else r.temperature,
        top_p=1.0 if validation else r.top_p,
        top_k=0 if validation else r.top_k,
        min_p=0.0 if validation else r.min_p,
        repetition_penalty=1.0 if validation else r.repetition_penalty,
        max_new_tokens=r.max_new_tokens,
        stop_token_ids=tuple(r.stop_token_ids),
        stop_strings=tuple(r.stop_strings),
        allowed_token_ids=tuple(r.action_token_ids),
        grammar=grammars[0] if grammars else None,
        turn_grammars=tuple(grammars) if len(grammars) > 1 else (),
        n=r.val_samples_per_prompt if validation else r.samples_per_prompt,
    )


def make_requests(
    prompt_ids: Sequence[list[int]],
    params: SamplingParams,
    seed: int,
    images: Sequence[tuple[ImageInput, ...]] | None = None,
) -> list[GenerationRequest]:
    """One request per prompt (with its images, when given); request i samples with seed `seed + i` so a
    resumed run draws the same."""
    return [
        GenerationRequest(
            prompt_ids=list(ids),
            params=_with_seed(params, seed + i),
            request_id=i,
            images=tuple(images[i]) if images is not None else (),
        )
        for i, ids in enumerate(prompt_ids)
    ]


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return replace(params, seed=seed)


def to_groups(
    items: Sequence[Any],
    generations: Sequence[list[Generation]],
    *,
    decode: Callable[[list[int]], str],
    policy_version: int = 0,
) -> list[Group]:
    """One group per prompt: its generations as episodes, in the order the engine returned them.

    Each episode keeps its tokens' policy versions; `policy_version` (its oldest token's) falls back to
    the argument for generations that carry none (an engine called directly, as `ascent eval` does).
    The responses are decoded together where `decode` has a `many` (see `decode_many`)."""
    pairs = [(item, gen) for item, gens in zip(items, generations, strict=True) for gen in gens]
    texts = iter(decode_many(decode, [gen.token_ids for _, gen in pairs]))
    episodes = iter([_episode(item, gen, next(texts), policy_version) for item, gen in pairs])
    return [Group(tuple(next(episodes) for _ in gens)) for gens in generations]


def decode_many(decode: Callable[[list[int]], str], seqs: list[list[int]]) -> list[str]:
    """Every sequence decoded: by `decode.many(seqs)` where the decoder has one (a tokenizer's batch decode,
    `TextDecoder`), else one call each."""
    many = getattr(decode, "many", None)
    return list(many(seqs)) if many is not None else [decode(s) for s in seqs]


class TextDecoder:
    """A tokenizer's decode as the loop uses it (`skip_special_tokens`), one sequence or many.

    `many` hands a batch to the Rust tokenizer's `decode_batch` (no Python per sequence, threads across
    cores) where that gives what `decode` gives: a fast tokenizer that does not clean up spaces afterwards
    (transformers' `clean_up_tokenization_spaces` is a Python pass `decode_batch` lacks). Else one call each."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        fast = getattr(tokenizer, "is_fast", False) and hasattr(tokenizer, "backend_tokenizer")
        self.batched = bool(fast and not getattr(tokenizer, "clean_up_tokenization_spaces", False))

    def __call__(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=self.skip))

    def many(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        if not self.batched or not seqs:
            return [self(s) for s in seqs]
        backend = self.tokenizer.backend_tokenizer
        return list(backend.decode_batch([list(s) for s in seqs], skip_special_tokens=self.skip))


def _episode(item: Any, gen: Generation, text: str, policy_version: int) -> Episode:
    return Episode(
        prompt_ids=list(item.prompt_ids),
        response_ids=list(gen.token_ids),
        sampler_logprobs=list(gen.logprobs),
        loss_mask=gen.loss_mask(),
        finish_reason=gen.finish_reason,
        row_id=item.row_id,
        policy_version=min(gen.token_versions, default=policy_version),
        token_versions=list(gen.token_versions),
        response_text=text,
        metadata=item.metadata,
        images=item_images(item),
        routed_experts=gen.routed_experts,
    )


def item_images(item: Any) -> tuple[ImageInput, ...]:
    """The images a data item's prompt shows (`PromptItem.images`; an item without the field shows none)."""
    return tuple(getattr(item, "images", ()))


def group_ids(groups: Sequence[Group]) -> torch.Tensor:
    """[N] long: for each episode of `flatten(groups)`, the place of its group in `groups`."""
    return torch.tensor([g for g, group in enumerate(groups) for _ in group.episodes], dtype=torch.long)


def padded(rows: Sequence[Sequence[float]], width: int, fill: float = 0.0) -> torch.Tensor:
    """Ragged rows (each at most `width` long) -> [B, width] float32 tensor padded with `fill`.

    One C-level pass over all values (numpy's fromiter over the chained rows) and one masked assignment:
    about 3x faster than a tensor per row at 512 rows of 512 (bench/driver_overhead.py), and this runs on
    the controller between the trainer's calls."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.float32, count=int(lengths.sum()))
    out = np.full((len(rows), width), fill, dtype=np.float32)
    out[np.arange(width) < lengths[:, None]] = flat
    return torch.from_numpy(out)


def advantage_inputs(
    groups: Sequence[Group],
    token_rewards: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    teacher_logprobs: Sequence[list[float]] | None = None,
    sum_pi_squared: tuple[Sequence[list[float]], Sequence[list[float]]] | None = None,
) -> AdvantageInputs:
    """Pack groups into the estimators' padded layout, one row per episode of `flatten(groups)`
    (token_rewards and values are [B, T] or None). With the teacher's per-token logprobs (distillation),
    the teacher's and the sampler's logprobs come along padded to [B, T]; with `sum_pi_squared` (the
    optimal-token baseline: the trainer's (old logprobs, Σπ²), one list per episode each) both padded."""
    episodes = flatten(groups)
    width = max(1, max(len(e.response_ids) for e in episodes))
    baselines = [g.baseline_reward for g in groups for _ in g.episodes]
    turns = [_turn_rewards(e) for e in episodes]
    return AdvantageInputs(
        rewards=torch.tensor([e.reward for e in episodes], dtype=torch.float32),
        mask=padded([e.loss_mask for e in episodes], width),
        group_ids=group_ids(groups),
        values=None if values is None else values[:, :width],
        token_rewards=None if token_rewards is None else token_rewards[:, :width],
        baseline_rewards=None if None in baselines else torch.tensor(baselines, dtype=torch.float32),
        turn_rewards=padded([t or [] for t in turns], width) if any(turns) else None,
        teacher_logprobs=None if teacher_logprobs is None else padded(teacher_logprobs, width),
        sampler_logprobs=None
        if teacher_logprobs is None
        else padded([e.sampler_logprobs for e in episodes], width),
        old_logprobs=None if sum_pi_squared is None else padded(sum_pi_squared[0], width),
        sum_pi_squared=None if sum_pi_squared is None else padded(sum_pi_squared[1], width),
    )


def distill_metrics(
    episodes: Sequence[Episode], teacher_logprobs: Sequence[list[float]] | None
) -> dict[str, float]:
    """`distill/reverse_kl`: the mean over sampled tokens (loss mask 1) of sampler - teacher logprob, the
    reverse KL estimate the distillation advantage pushes down; {} without a teacher."""
    if teacher_logprobs is None:
        return {}
    width = max(1, max(len(e.response_ids) for e in episodes))
    student = padded([e.sampler_logprobs for e in episodes], width)
    mask = padded([e.loss_mask for e in episodes], width)
    return {"distill/reverse_kl": float(reverse_kl(student, padded(teacher_logprobs, width), mask))}


def _turn_rewards(e: Episode) -> list[float] | None:
    """An environment episode's earlier turn rewards at the ends of their turns (see turn_end_rewards), when
    its reward is still the sum of its turns (not a failed episode's 0, nor a shaped reward)."""
    turns = e.metadata.get("turn_rewards") or []
    if len(turns) < 2 or abs(sum(turns) - e.reward) > 1e-6:
        return None
    return turn_end_rewards(turns, e.loss_mask)


@dataclass(frozen=True)
class Advantage:
    """The run's advantage estimator and the options it takes, resolved once at setup (`advantage_of`)."""

    estimator: Callable[..., Any]
    options: dict[str, Any]


def advantage_of(algo_cfg: AlgorithmConfig) -> Advantage:
    """`algorithm.advantage` (a built-in or a plug-in) with the settings it names as parameters."""
    estimator = resolve(ADVANTAGE_ESTIMATORS, algo_cfg.advantage.name, "algorithm.advantage")
    return Advantage(estimator, options_for(estimator, algo_cfg.settings_for(algo_cfg.advantage)))


def compute_advantages(
    groups: Sequence[Group],
    advantage: Advantage,
    *,
    token_rewards: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    teacher_logprobs: Sequence[list[float]] | None = None,
    sum_pi_squared: tuple[Sequence[list[float]], Sequence[list[float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the run's advantage estimator on the options it takes (`teacher_logprobs`: one list per episode,
    the distillation teacher's; `sum_pi_squared`: the trainer's old logprobs and Σπ², for the optimal-token
    baseline).

    Returns (advantages [B, T], returns [B, T])."""
    inputs = advantage_inputs(groups, token_rewards, values, teacher_logprobs, sum_pi_squared)
    out = advantage.estimator(inputs, **advantage.options)
    return out.advantages, out.returns


def train_samples(episodes: Sequence[Episode], routing_replay: bool = True) -> list[TrainSample]:
    """The episodes as trainer inputs: tokens, loss mask and sampler logprobs; no targets yet (advantages 0).
    The logprob passes (old, reference, critic values) read these; `with_targets` completes them.
    `routing_replay` (algorithm.routing_replay): an MoE episode's recorded experts go along for the trainer
    to replay; False leaves them behind (the trainer routes every token itself)."""
    return [
        TrainSample(
            prompt_ids=e.prompt_ids,
            response_ids=e.response_ids,
            loss_mask=e.loss_mask,
            advantages=[0.0] * len(e.response_ids),
            sampler_logprobs=e.sampler_logprobs,
            images=e.images,
            routed_experts=e.routed_experts if routing_replay else None,
            actions=e.actions,
        )
        for e in episodes
    ]


def with_targets(
    samples: Sequence[TrainSample],
    advantages: torch.Tensor,
    old_logprobs: Sequence[list[float]] | None,
    ref_logprobs: Sequence[list[float]] | None,
    *,
    returns: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> list[TrainSample]:
    """The samples with their per-token training targets: advantages [B, T], old/reference logprobs, and
    returns/values [B, T] (only with a critic, when both are given)."""
    critic = values is not None and returns is not None
    adv_rows = advantages.tolist()  # one conversion of the matrix, then list slices (no tensor per row)
    ret_rows = returns.tolist() if critic and returns is not None else None
    val_rows = values.tolist() if critic and values is not None else None
    out = []
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        out.append(
            replace(
                s,
                advantages=adv_rows[i][:n],
                old_logprobs=None if old_logprobs is None else old_logprobs[i],
                ref_logprobs=None if ref_logprobs is None else ref_logprobs[i],
                returns=None if ret_rows is None else ret_rows[i][:n],
                old_values=None if val_rows is None else val_rows[i][:n],
            )
        )
    return out


def filter_zero_advantage(samples: Sequence[TrainSample]) -> tuple[list[TrainSample], dict[str, float]]:
    """Take episodes whose advantage is zero on every token out of the loss (their mask zeroed).

    They carry no policy gradient but would dilute `token-mean`; zeroing the mask removes them from the
    mini-batch token count as well, so the batch shape (and divisibility) stays as configured.
    Returns the samples (the filtered ones replaced by masked copies) and `filter/zero_advantage_frac`.
    """
    out = [
        replace(s, loss_mask=[0] * len(s.loss_mask))
        if all(a == 0.0 for a, m in zip(s.advantages, s.loss_mask, strict=True) if m)
        else s
        for s in samples
    ]
    dropped = sum(o is not s for o, s in zip(out, samples, strict=True))
    return out, {"filter/zero_advantage_frac": dropped / max(len(samples), 1)}


def logprob_diff(
    trainer_lp: Sequence[list[float]], sampler_lp: Sequence[list[float]], masks: Sequence[list[int]]
) -> tuple[float, float]:
    """Mean and max |trainer - sampler| logprob over the SAMPLED response tokens (loss mask 1): the
    sampler/trainer mismatch. Observation tokens of a multi-turn episode (mask 0) have no sampler logprob
    (0.0 stands in), so counting them would report their whole logprob as a mismatch."""
    diffs = [
        abs(a - b)
        for tr, sa, mask in zip(trainer_lp, sampler_lp, masks, strict=True)
        for a, b, m in zip(tr, sa, mask, strict=True)
        if m
    ]
    if not diffs:
        return 0.0, 0.0
    return sum(diffs) / len(diffs), max(diffs)


OUTLIER_NATS, MAX_OUTLIERS = 0.5, 20


def record_logprob_outliers(
    run_dir: str, iteration: int, episodes: Sequence[Episode], trainer_lp: Sequence[list[float]]
) -> int:
    """Append the sampled tokens (loss mask 1) whose |trainer - sampler| logprob exceeds 0.5 nat to
    `logprob_outliers.jsonl` (at most 20 an iteration): where a mismatch sits, for a user or a bug report.
    Observation tokens (mask 0, no sampler logprob) are never listed. Returns how many."""

    rows: list[dict[str, Any]] = []
    for t, lp in zip(episodes, trainer_lp, strict=True):
        for pos, (a, b, m) in enumerate(zip(t.sampler_logprobs, lp, t.loss_mask, strict=True)):
            if m and abs(a - b) > OUTLIER_NATS and len(rows) < MAX_OUTLIERS:
                rows.append(
                    {
                        "iteration": iteration,
                        "row_id": t.row_id,
                        "position": pos,
                        "response_len": len(t.response_ids),
                        "finish": t.finish_reason,
                        "token": t.response_ids[pos],
                        "sampler": a,
                        "trainer": b,
                        "prompt_len": len(t.prompt_ids),
                        "response_ids": t.response_ids,
                    }
                )
    if rows:
        with open(Path(run_dir) / "logprob_outliers.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return len(rows)


def mini_batches(n: int, size: int, generator: torch.Generator | None) -> list[list[int]]:
    """Split indices 0..n-1 into mini-batches of `size` (shuffled when a generator is given)."""
    order = torch.randperm(n, generator=generator).tolist() if generator is not None else list(range(n))
    return [order[i : i + size] for i in range(0, n, size)]


def shard(items: Sequence[Any], num: int) -> list[list[Any]]:
    """Split items into `num` contiguous shards of ceil(len / num) (the last ones shorter or empty; equal
    when `num` divides the length)."""
    per = -(-len(items) // num)
    return [list(items[i * per : (i + 1) * per]) for i in range(num)]


def shard_requests(
    requests: Sequence[GenerationRequest], num: int
) -> tuple[list[list[GenerationRequest]], list[int]]:
    """Requests -> (`num` shards, each request's index in the shards' concatenation). A request goes to
    shard `request_id % num`: a multi-turn episode (whose request_id is the same every turn) stays on the
    replica that caches its history. `[flat[k] for k in positions]` puts the shards' results back in order."""
    shards: list[list[GenerationRequest]] = [[] for _ in range(num)]
    slots = []
    for r in requests:
        w = r.request_id % num
        slots.append((w, len(shards[w])))
        shards[w].append(r)
    starts = [sum(len(x) for x in shards[:w]) for w in range(num)]
    return shards, [starts[w] + j for w, j in slots]
