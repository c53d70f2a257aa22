"""Host state of one sampled sequence, its stop conditions and how requests become sequences (no device
tensors).

A `Sequence` is one of the n samples of a request. Its counters follow the decode pipeline: `num_cached`
counts prompt and generated tokens whose K/V are written (or being written by a launched step), `launched`
counts tokens sampled or in flight, `tokens` / `logprobs` hold what has come back to the host, `versions`
the policy version of the weights that sampled each of them. An MoE model's `routes` hold host chunks
[tokens, MoE layers, k] of the experts each computed token went to, in token order from the first (a
cached session prefix, the prefill, then one row per decode step, fed prompt tokens included).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ascent.messages import FinishReason, Generation, GenerationRequest, ImageInput, SamplingParams
from ascent.models.moe import NOT_RECORDED, ROUTES_DTYPE
from ascent.rollout.sampling import split_seed

ImageSpan = tuple[int, int, tuple[str, tuple[int, int, int]]]  # start, end, (digest, grid) of one image


@dataclass
class Sequence:
    req: int
    sample: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    max_new: int  # max_new_tokens capped by max_model_len
    stop_ids: frozenset[int]
    session_id: str | None = None
    pages: list[int] = field(default_factory=list)
    reserved: int = 0
    num_cached: int = 0
    launched: int = 0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(
        default_factory=list
    )  # per token: the weights' policy version that sampled it
    epoch: int = 0  # the engine's publication count when it was admitted (a later one: it saw a swap)
    finish: FinishReason | None = None
    row: int = -1
    idle: bool = False  # its decode row was made idle (token budget launched, last tokens in flight)
    stop_checked: int = 0
    cached: int = 0  # prompt tokens whose K/V came from a cached session (not prefilled)
    fed: int = 0  # prompt tokens computed by decode steps instead of a prefill (state.py, "Prompt feeding")
    skip: int = 0  # outputs of launched steps still to throw away (they read prompt tokens, fed - 1 in all)
    images: tuple[ImageInput, ...] = ()  # one per image-token run of the prompt, in order (vision.py)
    image_keys: tuple[ImageSpan, ...] = ()  # (start, end, digest and grid) of each image's run
    rope_delta: int = 0  # multimodal RoPE: a decode token's rotary position minus its index (vision.py)
    deadline: float | None = None  # time.monotonic() past which it ends as "abort" (params.max_time_s)
    routes: list[Tensor] | None = None  # MoE: host chunks [tokens, layers, k] (module docstring)
    action: list[list[float]] | None = None  # an action head's chunk: the turn is its one token (action.py)

    @property
    def routed(self) -> int:
        """Tokens whose experts are recorded so far (MoE), counted from the first prompt token."""
        return sum(len(r) for r in self.routes) if self.routes is not None else 0

    def routed_experts(self) -> Tensor | None:
        """MoE: [prompt + response tokens, layers, k] ROUTES_DTYPE, the reference engine's layout: tokens no
        forward computed (the last sampled one) are NOT_RECORDED. None for a dense model."""
        if self.routes is None:
            return None
        n = len(self.prompt) + len(self.tokens)
        got = torch.cat(self.routes)[:n] if self.routes else None
        shape = got.shape[1:] if got is not None else (0, 0)
        out = torch.full((n, *shape), NOT_RECORDED, dtype=ROUTES_DTYPE)
        if got is not None:
            out[: len(got)] = got
        return out

    @property
    def exhausted(self) -> bool:
        """No more decode steps to launch: the token budget is spent by sampled or in-flight tokens."""
        return self.launched >= self.max_new + max(self.fed - 1, 0)

    def generation(self, stamped: bool = True) -> Generation:
        """The sequence as a Generation; `stamped=False` leaves token_versions empty (no version known)."""
        versions = list(self.versions) if stamped else []
        return Generation(
            list(self.tokens),
            list(self.logprobs),
            self.finish or "abort",
            versions,
            cached_tokens=self.cached,
            routed_experts=self.routed_experts(),
            action=self.action,
        )

    def restart(self) -> None:
        """Forget everything sampled (pages and reservation already returned): ready to be admitted again."""
        self.pages, self.reserved, self.num_cached, self.launched = [], 0, 0, 0
        self.tokens, self.logprobs, self.versions, self.action = [], [], [], None
        self.finish, self.row, self.idle, self.stop_checked, self.cached = None, -1, False, 0, 0
        self.fed = self.skip = 0
        self.routes = [] if self.routes is not None else None


def image_spans(ids: list[int], token_id: int) -> list[tuple[int, int]]:
    """[(start, end)] of each run of `token_id` in `ids`, in order."""
    spans: list[tuple[int, int]] = []
    start = -1
    for i, t in enumerate([*ids, None]):
        if t == token_id and start < 0:
            start = i
        elif t != token_id and start >= 0:
            spans.append((start, i))
            start = -1
    return spans


def _image_keys(req: GenerationRequest, image_token: int | None) -> tuple[ImageSpan, ...]:
    """Check a request's images against its prompt -> the (start, end, key) of each image's run."""
    if not req.images:
        return ()
    if image_token is None:
        raise ValueError(
            f"request {req.request_id}: it has {len(req.images)} images and the model takes none; use a "
            "vision-language checkpoint (Qwen2.5-VL, Qwen3-VL) for image prompts."
        )
    spans = image_spans(req.prompt_ids, image_token)
    want = [im.num_tokens for im in req.images]
    if [e - s for s, e in spans] != want:
        raise ValueError(
            f"request {req.request_id}: its token ids hold image-token runs of lengths "
            f"{[e - s for s, e in spans]}, its images need {want}; expand each image's <|image_pad|> to its "
            "num_tokens (ascent.models.vision.ImageCodec.expand)."
        )
    return tuple((s, e, (im.digest, im.grid_thw)) for (s, e), im in zip(spans, req.images, strict=True))


def stop_string_cut(
    tokens: list[int], start: int, stops: tuple[str, ...], decode: Callable[[list[int]], str]
) -> int | None:
    """Smallest n such that decode(tokens[start:n]) contains a stop string, or None.

    `start` should reach back far enough for the longest stop string (the caller keeps a look-back).
    """
    text = decode(tokens[start:])
    if not any(s in text for s in stops):
        return None
    for n in range(start + 1, len(tokens) + 1):
        piece = decode(tokens[start:n])
        if any(s in piece for s in stops):
            return n
    return len(tokens)


def check_finished(seq: Sequence, decode: Callable[[list[int]], str] | None, interval: int) -> bool:
    """Update `seq.finish` from its newest token; truncate at a stop string. -> finished?

    A stop token ends the sequence (and stays in it). Stop strings are checked on the host every `interval`
    tokens and whenever the sequence ends otherwise; the sequence is cut after the token that completes
    the string. Then the token budget ends it with "length" ("stop" for an action turn, which samples only
    among `allowed_token_ids`, once it holds max_new_tokens of them: one whole action, as the reference
    engine ends it), and a spent wall-clock budget (`params.max_time_s`) with "abort". An action head's turn
    (`seq.action`, action.py) is its one placeholder token: "stop".
    """
    if seq.action is not None:
        seq.finish = "stop"
        return True
    stop_hit = bool(seq.tokens) and seq.tokens[-1] in seq.stop_ids
    done = stop_hit or len(seq.tokens) >= seq.max_new
    stops = seq.params.stop_strings
    if stops and decode is not None and (done or len(seq.tokens) - seq.stop_checked >= interval):
        look_back = max(len(s) for s in stops) + 2
        cut = stop_string_cut(seq.tokens, max(0, seq.stop_checked - look_back), stops, decode)
        seq.stop_checked = len(seq.tokens)
        if cut is not None:
            del seq.tokens[cut:], seq.logprobs[cut:], seq.versions[cut:]
            seq.finish = "stop"
            return True
    if stop_hit:
        seq.finish = "stop"
    elif len(seq.tokens) >= seq.max_new:
        full_action = bool(seq.params.allowed_token_ids) and len(seq.tokens) >= seq.params.max_new_tokens
        seq.finish = "stop" if full_action else "length"
    elif seq.deadline is not None and time.monotonic() >= seq.deadline:
        seq.finish = "abort"  # its wall-clock budget (SamplingParams.max_time_s) is spent
    return seq.finish is not None


def expand_requests(
    requests: list[GenerationRequest],
    out: list[list[Any]],
    offset: int,
    *,
    eos: frozenset[int],
    max_model_len: int,
    can_decode: bool,
    fresh_seed: Callable[[], int],
    image_token: int | None = None,
) -> list[list[Sequence]]:
    """Validate requests and turn each into its n `Sequence`s (one group per request); a request with no
    room left under max_model_len is answered at once with empty "length" generations in `out[offset + i]`.
    Seeded requests give sample i the seed `split_seed(seed, i)`; unseeded ones draw `fresh_seed()`. Images
    need `image_token` (a vision-language model's) and one run of it per image, of its size."""
    groups: list[list[Sequence]] = []
    for pos, req in enumerate(requests, start=offset):
        p = req.params
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id}: prompt_ids is empty; give at least one token.")
        if p.stop_strings and not can_decode:
            raise ValueError(
                f"request {req.request_id}: stop_strings need a decode callable; build the "
                "engine with decode=tokenizer.decode (or a tokenizer_path)."
            )
        keys = _image_keys(req, image_token)
        max_new = min(p.max_new_tokens, max_model_len - len(req.prompt_ids))
        if max_new <= 0:
            out[pos] = [Generation([], [], "length") for _ in range(p.n)]
            continue
        stop_ids = eos | frozenset(p.stop_token_ids)
        seeds = [split_seed(p.seed, i) if p.seed is not None else fresh_seed() for i in range(p.n)]
        deadline = None if p.max_time_s is None else time.monotonic() + p.max_time_s
        group = [
            Sequence(
                pos,
                i,
                list(req.prompt_ids),
                p,
                seeds[i],
                max_new,
                stop_ids,
                req.session_id,
                deadline=deadline,
            )
            for i in range(p.n)
        ]
        for s in group:
            s.images, s.image_keys = req.images, keys
        groups.append(group)
    return groups
