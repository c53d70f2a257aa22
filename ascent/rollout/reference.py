"""The reference rollout engine: plain transformers forward passes with a KV cache, our own sampler.

It is the engine that runs everywhere (CPU tests, one GPU, debugging) and the yardstick the fast GPU engine
is checked against. It never calls `model.generate`: each step runs the model once, then
`ascent.rollout.sampling.sample` picks the tokens, so every returned logprob follows the contract
(`log_softmax(logits / T)` of the sampled token, before filtering).

Constrained decoding: a request whose `params.grammar` is set samples only what the grammar allows, through
the engine's `constraints` factory (`(grammar, vocab size) -> TokenConstraint`, one per row: the HTTP server
gives it one built on llguidance, `ascent.rollout.server.grammar`); its mask joins the sampler's filters.
A request whose `params.allowed_token_ids` is set (a VLA's action tokens, `rollout.action_token_ids`) samples
only among those ids, a filter of the same kind, and its turn is complete (finish "stop") once it holds
`max_new_tokens` of them: one action of that many dimensions.

Batching: up to `batch_size` sequences decode together. Prompts are left-padded; the attention mask hides
the padding and explicit position ids start every row at 0, so a row's tokens do not depend on its
neighbours (up to float rounding). Finished rows keep running until the whole batch is done (simple, and
the reference engine is not the fast path).

Images (a vision-language model, `ascent.models.multimodal`): a request's `images` go with its prompt in the
first forward of the batch (every image of every row, row by row; the vision tower runs once per distinct
image, so a request's n samples share one pass). Positions are then multimodal RoPE's
three rows, computed per row by the model's own `get_rope_index` and left-padded like the ids; each
generated token takes the row's largest position plus one (what transformers' `rope_deltas` amount to), so
rows with different images, or none, batch together and score as a lone forward of the same sequence does.

Mixture-of-experts models: every forward's routers are recorded (`ascent.models.moe.RoutingRecorder`), and
each generation carries the experts chosen for its prompt and response tokens (`routed_experts`), which the
trainer replays (routing replay).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ascent.messages import FinishReason, Generation, GenerationRequest, ImageInput, SamplingParams
from ascent.models.action_head import ActionHeadSpec, action_head_of, attach_action_head
from ascent.models.loading import cache_kwarg, load_model
from ascent.models.moe import NOT_RECORDED, ROUTES_DTYPE, RoutingRecorder, is_moe
from ascent.models.multimodal import (
    check_images,
    image_features,
    image_token_id,
    is_vision_language,
    mrope_positions,
    multimodal_backbone,
)
from ascent.rollout import action_sampler
from ascent.rollout.adapter import AdapterMerger
from ascent.rollout.sampling import SamplingTensors, sample, split_seed, token_presence


class TokenConstraint(Protocol):
    """One row's grammar: `allowed()` -> [V] bool, the tokens that may come next (at least one);
    `advance(token)` follows the token sampled."""

    def allowed(self) -> Tensor: ...

    def advance(self, token: int) -> None: ...


ConstraintFactory = Callable[[str, int], TokenConstraint]  # (grammar, vocab size) -> a fresh constraint


@dataclass
class _Row:
    """One sequence being generated: sample `index` of request `request_pos`."""

    request_pos: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    images: tuple[ImageInput, ...] = ()
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)  # per token: its grammar allowed it alone
    finish_reason: FinishReason | None = None
    routed_experts: Tensor | None = None  # MoE: [prompt + response tokens, layers, k] (module docstring)
    deadline: float | None = None  # time.monotonic() past which the row ends as "abort" (params.max_time_s)


class ReferenceEngine:
    """A RolloutEngine on a transformers causal LM (any module called as `model(input_ids=..., ...)`).

    The engine uses `model` as given: pass the trainer's module to share weights (the engine switches it
    to eval mode while generating and restores the mode after), or `copy.deepcopy(model)` for an owned copy.
    `decode(token_ids) -> str` is needed only for requests with stop strings.
    """

    def __init__(
        self,
        model: nn.Module,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        decode: Callable[[list[int]], str] | None = None,
        batch_size: int = 64,
        action_head: ActionHeadSpec | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"rollout.generation_batch_size={batch_size}: set it to 1 or more.")
        self.model = model
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.decode = decode
        self.batch_size = batch_size
        self.constraints: ConstraintFactory | None = None  # for requests with a grammar (module docstring)
        self.adapters = AdapterMerger(model.get_parameter)  # LoRA adapter-only publications (adapter.py)
        self.action_head = action_head  # answer each request with an action chunk (`action_sampler`)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: str | torch.dtype = "fp32",
        device: str | torch.device = "auto",
        eos_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        decode: Callable[[list[int]], str] | None = None,
        batch_size: int = 64,
        trust_remote_code: bool = False,
        action_head: ActionHeadSpec | None = None,
    ) -> ReferenceEngine:
        """Load the checkpoint in `path`; EOS and pad ids default to the model's generation config. With
        `action_head`, the head is attached (and loaded from the checkpoint when it has one)."""

        model = load_model(path, dtype, device, trust_remote_code=trust_remote_code)
        if action_head is not None:
            attach_action_head(model, action_head, path)
        gen = model.generation_config
        if eos_token_ids is None:
            eos = gen.eos_token_id if gen.eos_token_id is not None else model.config.eos_token_id
            eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if pad_token_id is None:  # any id works: padded positions are masked out
            pad = gen.pad_token_id if gen.pad_token_id is not None else model.config.pad_token_id
            pad_token_id = pad if pad is not None else next(iter(eos_token_ids), 0)
        return cls(
            model, eos_token_ids, pad_token_id, decode=decode, batch_size=batch_size, action_head=action_head
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---- RolloutEngine protocol -------------------------------------------------------------------------

    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        """For each request, `request.params.n` generations, in request order (with an action head: one
        action each, `ascent.rollout.action_sampler.generations`)."""
        if self.action_head is not None:
            return self._act(requests)
        rows = self._expand(requests)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(rows), self.batch_size):
                self._generate_batch(rows[start : start + self.batch_size])
        finally:
            self.model.train(was_training)
        out: list[list[Generation]] = [[] for _ in requests]
        for row in rows:
            assert row.finish_reason is not None
            gen = Generation(
                row.token_ids,
                row.logprobs,
                row.finish_reason,
                routed_experts=row.routed_experts,
                forced=row.forced if any(row.forced) else [],
            )
            out[row.request_pos].append(gen)
        return out

    def _act(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        head = action_head_of(self.model)
        if head is None:
            raise ValueError("the engine was built with an action head spec, but its model carries no head")
        was_training = self.model.training
        self.model.eval()
        token_id = self.action_head.token_id if self.action_head is not None else 0
        try:
            return action_sampler.generations(self.model, head, requests, token_id)
        finally:
            self.model.train(was_training)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy (name, tensor) pairs into the model's parameters and buffers (Hugging Face names).

        Partial updates (one bucket at a time) are fine; an unknown name or a wrong shape is an error.
        A LoRA adapter (`layer.lora_A` / `lora_B` / `lora_scaling`) is merged into the layer's pristine base
        weight (`ascent.rollout.adapter`).
        """
        targets = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in self.adapters.apply(named_tensors):
                if name not in targets:
                    known = ", ".join(list(targets)[:3])
                    raise KeyError(
                        f"update_weights: the model has no parameter named {name!r} (names look like "
                        f"{known}, ...); send Hugging Face names without wrapper prefixes such as 'module.'."
                    )
                target = targets[name]
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model expects "
                        f"{tuple(target.shape)}."
                    )
                target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))

    def sleep(self, release_weights: bool = False) -> None:
        """No-op: the KV cache lives only inside `generate`, so there is nothing to free between calls.

        `release_weights` is ignored: this engine keeps its model (colocated runs use the fast engine)."""

    def wake(self) -> None:
        """No-op (see `sleep`)."""

    # ---- internals -------------------------------------------------------------------------------------

    def _expand(self, requests: list[GenerationRequest]) -> list[_Row]:
        """One _Row per sample; seeded requests get per-sample seeds, others draw from torch's global RNG."""
        rows = []
        for pos, req in enumerate(requests):
            if not req.prompt_ids:
                raise ValueError(f"request {req.request_id}: prompt_ids is empty; give at least one token.")
            if req.params.stop_strings and self.decode is None:
                raise ValueError(
                    f"request {req.request_id}: stop_strings={list(req.params.stop_strings)} need a decode "
                    "callable; construct ReferenceEngine(..., decode=tokenizer.decode)."
                )
            if req.params.grammar is not None and self.constraints is None:
                raise ValueError(
                    f"request {req.request_id}: it has a grammar, and this engine was given no constraint "
                    "factory; set engine.constraints (ascent.rollout.constraints.LLGuidanceConstraints)."
                )
            self._check_images(req)
            for i in range(req.params.n):
                if req.params.seed is None:
                    seed = int(torch.randint(0, 2**62, ()).item())
                else:
                    seed = split_seed(req.params.seed, i)
                row = _Row(pos, list(req.prompt_ids), req.params, seed, req.images)
                if req.params.max_time_s is not None:
                    row.deadline = time.monotonic() + req.params.max_time_s
                rows.append(row)
        return rows

    def _check_images(self, req: GenerationRequest) -> None:
        """Refuse images for a text-only model, and images that do not match the prompt's image-token runs."""
        if not req.images:
            return
        if not is_vision_language(self.model):
            raise ValueError(
                f"request {req.request_id}: it has {len(req.images)} images and the model "
                f"({type(self.model).__name__}) takes none; use a vision-language checkpoint (Qwen2.5-VL, "
                "Qwen3-VL) for image prompts."
            )
        ids = torch.tensor(req.prompt_ids, dtype=torch.long)
        check_images(ids, req.images, image_token_id(self.model), f"request {req.request_id}")

    def _prompt_inputs(self, rows: list[_Row]) -> tuple[Tensor, Tensor, Tensor, dict[str, Any]]:
        """-> input_ids, attention_mask [b, L] (left-padded), position_ids ([b, L], or [3, b, L] when a row
        has images: multimodal RoPE, padding at 0) and the image keywords of the first forward."""
        input_ids, attention_mask = self._left_pad(rows)
        if not any(r.images for r in rows):
            return input_ids, attention_mask, (attention_mask.cumsum(-1) - 1).clamp(min=0), {}
        length = input_ids.shape[1]
        positions = torch.zeros((3, len(rows), length), dtype=torch.long, device=input_ids.device)
        for i, r in enumerate(rows):
            n = len(r.prompt_ids)
            positions[:, i, length - n :] = mrope_positions(self.model, input_ids[i, length - n :], r.images)
        images = [im for r in rows for im in r.images]  # each distinct one through the tower once
        features = image_features(multimodal_backbone(self.model), input_ids, images, self.device)
        return input_ids, attention_mask, positions, features

    def _left_pad(self, rows: list[_Row]) -> tuple[Tensor, Tensor]:
        """-> input_ids [b, L] (left-padded with pad_token_id), attention_mask [b, L] (1 = real token)."""
        length = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, length - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, length - len(r.prompt_ids) :] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def _generate_batch(self, rows: list[_Row]) -> None:
        """Decode `rows` together until each stops or reaches its max_new_tokens; fills the rows in place."""
        from transformers import DynamicCache  # deferred: transformers, slow to import

        device = self.device
        input_ids, attention_mask, position_ids, images = self._prompt_inputs(rows)
        next_position = position_ids.amax(dim=-1, keepdim=True)  # [b, 1] or [3, b, 1]
        if next_position.dim() == 3:
            next_position = next_position.amax(dim=0, keepdim=True).expand(3, -1, -1)
        st = SamplingTensors.from_params([r.params for r in rows], [r.seed for r in rows], device)
        prompt_tokens = torch.where(attention_mask.bool(), input_ids, -1)  # [b, L], -1 = padding
        seen = None
        cache = {cache_kwarg(self.model): DynamicCache()}  # one cache object, reused (filled) every step
        max_steps = max(r.params.max_new_tokens for r in rows)
        grammars: list[TokenConstraint | None] = []  # made at the first step, once the vocabulary is known
        recorder = RoutingRecorder(self.model) if is_moe(self.model) else None
        routes: list[Tensor] = []  # per forward, [b, tokens of the step, layers, k]
        for step in range(max_steps):
            with recorder or contextlib.nullcontext():
                out = self.model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=True,
                    **cache,
                    **(images if step == 0 else {}),
                    logits_to_keep=1,
                )
            if recorder is not None:
                ids = recorder.take()
                routes.append(ids.view(len(rows), input_ids.shape[1], *ids.shape[1:]))
            logits = out.logits[:, -1, :]
            if st.use_penalty and seen is None:
                seen = token_presence(prompt_tokens, logits.shape[-1])
            steps = torch.full((len(rows),), step, dtype=torch.long, device=device)
            if step == 0:
                grammars = self._constraints(rows, logits.shape[-1])
            allowed = _allowed(rows, grammars, logits.shape[-1], device) if grammars else None
            forced = (allowed.sum(-1) == 1).tolist() if allowed is not None else [False] * len(rows)
            allowed = _only_allowed_ids(rows, allowed, logits.shape, device)
            allowed = self._without_image_tokens(allowed, logits.shape)
            tokens, logprobs = sample(logits, st, steps, seen, allowed)
            token_list = tokens.tolist()
            # grammars holds one entry per row, or none at all
            for row, grammar, token in zip(rows, grammars, token_list, strict=False):
                if grammar is not None and row.finish_reason is None:
                    grammar.advance(token)
            if self._record(rows, token_list, logprobs.tolist(), forced):
                break
            if seen is not None:
                seen.scatter_(1, tokens[:, None], True)
            input_ids = tokens[:, None]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(rows), 1)], dim=1)
            next_position = next_position + 1
            position_ids = next_position
        if routes:
            _assign_routes(rows, routes)

    def _without_image_tokens(self, allowed: Tensor | None, shape: torch.Size) -> Tensor | None:
        """`allowed` [b, V] (or everything) less the image and video pad tokens, for a vision-language
        model: a generated pad would stand for an image that does not exist, and the trainer could not score
        it. Text models: `allowed` as it is. (A filter: logprobs stay those of the unfiltered distribution.)"""
        if not is_vision_language(self.model):
            return allowed
        out = allowed if allowed is not None else torch.ones(shape, dtype=torch.bool, device=self.device)
        config = self.model.config
        for name in ("image_token_id", "video_token_id"):
            token = getattr(config, name, None)
            if isinstance(token, int) and token < shape[-1]:
                out[:, token] = False
        return out

    def _constraints(self, rows: list[_Row], vocab_size: int) -> list[TokenConstraint | None]:
        """One constraint per row with a grammar, else None; [] when no row has one."""
        if self.constraints is None or all(r.params.grammar is None for r in rows):
            return []
        make = self.constraints
        return [make(r.params.grammar, vocab_size) if r.params.grammar is not None else None for r in rows]

    def _record(self, rows: list[_Row], tokens: list[int], logprobs: list[float], forced: list[bool]) -> bool:
        """Append one step's token (and whether its grammar forced it) to each unfinished row and mark rows
        that end; True when all ended."""
        for row, token, logprob, only in zip(rows, tokens, logprobs, forced, strict=True):
            if row.finish_reason is not None:
                continue
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            row.forced.append(only)
            if (
                token in self.eos_token_ids
                or token in row.params.stop_token_ids
                or self._hit_stop_string(row)
            ):
                row.finish_reason = "stop"
            elif len(row.token_ids) >= row.params.max_new_tokens:  # a full action turn is complete
                row.finish_reason = "stop" if row.params.allowed_token_ids else "length"
            elif row.deadline is not None and time.monotonic() >= row.deadline:
                row.finish_reason = "abort"  # its wall-clock budget (SamplingParams.max_time_s) is spent
        return all(r.finish_reason is not None for r in rows)

    def _hit_stop_string(self, row: _Row) -> bool:
        """Whether the decoded tail of the response contains one of the row's stop strings.

        Only the last few tokens are decoded (enough to hold the longest stop string, since a token decodes
        to at least one character), so the check stays cheap on long responses.
        """
        stops = row.params.stop_strings
        if not stops:
            return False
        assert self.decode is not None
        window = max(len(s) for s in stops) + 1
        text = self.decode(row.token_ids[-window:])
        return any(s in text for s in stops)


def _assign_routes(rows: list[_Row], routes: list[Tensor]) -> None:
    """Each row's experts from the forwards of its batch: routes[0] [b, L, layers, k] (the left-padded
    prompts), routes[s] [b, 1, layers, k] (generated token s - 1 going in). A row's last token never went
    in (nothing was sampled after it): NOT_RECORDED there. -> row.routed_experts [P + n, layers, k], CPU."""
    prompt = routes[0].cpu()
    steps = torch.cat(routes[1:], dim=1).cpu() if len(routes) > 1 else prompt[:, :0]
    for i, row in enumerate(rows):
        p, n = len(row.prompt_ids), len(row.token_ids)
        out = torch.full((p + n, *prompt.shape[2:]), NOT_RECORDED, dtype=ROUTES_DTYPE)
        out[:p] = prompt[i, prompt.shape[1] - p :]
        got = min(n, steps.shape[1])
        out[p : p + got] = steps[i, :got]
        row.routed_experts = out


def _only_allowed_ids(
    rows: list[_Row], allowed: Tensor | None, shape: torch.Size, device: torch.device
) -> Tensor | None:
    """`allowed` [b, V] (or everything) narrowed, in each row with `params.allowed_token_ids`, to those ids
    (a VLA's action tokens); `allowed` as it is when no row names any."""
    if not any(r.params.allowed_token_ids for r in rows):
        return allowed
    out = allowed if allowed is not None else torch.ones(shape, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        if row.params.allowed_token_ids:
            keep = torch.zeros(shape[-1], dtype=torch.bool, device=device)
            keep[list(row.params.allowed_token_ids)] = True
            out[i] &= keep
    return out


def _allowed(
    rows: list[_Row], grammars: list[TokenConstraint | None], vocab_size: int, device: torch.device
) -> Tensor:
    """[b, V] bool: each unfinished constrained row's grammar mask; every token for the other rows."""
    out = torch.ones(len(rows), vocab_size, dtype=torch.bool)
    for i, (row, grammar) in enumerate(zip(rows, grammars, strict=True)):
        if grammar is not None and row.finish_reason is None:
            out[i] = grammar.allowed()
    return out.to(device)
