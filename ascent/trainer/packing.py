"""Pack trajectories into micro-batches for the policy update (design: "trainer/ ... packing").

Two steps. `plan_micro_batches` splits a mini-batch into micro-batches under a token budget
(`train.max_tokens_per_micro_batch`), first-fit-decreasing. `pack` lays one micro-batch's sequences back to
back in ONE row, with no padding:

    input_ids    [1, N]   prompt_0 response_0 prompt_1 response_1 ...
    position_ids [1, N]   0 1 2 ... 0 1 2 ...     (restarts at 0 for every sequence)

With `attention_mask=None` and no KV cache, transformers (>= 5, `masking_utils.find_packed_sequence_indices`)
reads the restarts in `position_ids` and builds a block-causal mask, so attention never crosses sequences
(sdpa and eager; flash-attention uses the same positions). The per-token training tensors are flat over the
M response tokens and aligned to next-token prediction: response token j of a sequence whose prompt has P
tokens sits at row position o + P + j and is predicted by the logit at o + P + j - 1 (`logit_index`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor

from ascent.messages import ImageInput, TrainSample


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """lengths [S] (tokens per sequence) -> micro-batches as lists of sequence indices, each <= max_tokens.

    First-fit-decreasing: longest sequence first, into the first micro-batch with room. Deterministic; the
    indices inside a micro-batch are sorted ascending. Raises ValueError if one sequence alone is too long.
    """
    if max_tokens <= 0:
        raise ValueError(f"train.max_tokens_per_micro_batch={max_tokens}: must be a positive token count.")
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise ValueError(
                f"train.max_tokens_per_micro_batch={max_tokens}: sequence {i} has {n} tokens (prompt + "
                f"response) and a sequence is never split; raise train.max_tokens_per_micro_batch to at "
                f"least {n} (or lower data.max_prompt_tokens / rollout.max_new_tokens)."
            )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(max_tokens - lengths[i])
    return [sorted(b) for b in bins]


@dataclass
class PackedBatch:
    """One micro-batch in packed layout. N = total tokens, M = total response tokens, S = sequences.

    `input_ids`, `position_ids`: [1, N] long. Flat per-response-token tensors, [M]: `logit_index` (long,
    position in the row of the logit that predicts the token), `targets` (long), `loss_mask` (float 0/1),
    `advantages` (float), `seq_ids` (long 0..S-1); `old_logprobs`, `ref_logprobs`, `sampler_logprobs` and the
    critic's targets `returns`, `old_values` are float [M] or None when any sample lacks them.
    `response_lens`: S ints, to split [M] back per sequence. `cu_seqlens` [S+1] int32 (sequence starts in the
    row, then N) and `max_seqlen` (longest sequence) are the boundaries varlen attention needs, known here on
    the host so the GPU never has to be asked for them. `seq_images`: S tuples, each sequence's images in
    the order of its image-token runs (empty for text). `routed_experts` [N, moe layers, k] long: the
    sampler's experts for every token of the row (-1 where a sample has none; `ascent.models.moe`), None
    when no sample carries any. `action_rows` [A] and `actions` [A, chunk, dim]: an action-head policy's
    actions (each sample's loss-mask-1 tokens, in order, are its actions), None when no sample has any.
    """

    input_ids: Tensor
    position_ids: Tensor
    logit_index: Tensor
    targets: Tensor
    loss_mask: Tensor
    advantages: Tensor
    seq_ids: Tensor
    old_logprobs: Tensor | None
    ref_logprobs: Tensor | None
    sampler_logprobs: Tensor | None
    response_lens: list[int]
    returns: Tensor | None = None
    old_values: Tensor | None = None
    cu_seqlens: Tensor | None = None
    max_seqlen: int = 0
    seq_images: list[tuple[ImageInput, ...]] = field(default_factory=list)
    routed_experts: Tensor | None = None
    action_rows: Tensor | None = None  # long [A]: the rows of M that are action placeholders
    actions: Tensor | None = None  # float [A, chunk, action_dim]: their chunks (`TrainSample.actions`)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def images(self) -> list[ImageInput]:
        """Every image of the row, sequence by sequence (the order the model scatters them in)."""
        return [im for seq in self.seq_images for im in seq]

    @property
    def num_seqs(self) -> int:
        return len(self.response_lens)

    def split(self, flat: Tensor) -> list[list[float]]:
        """flat [M] -> one list of floats per sequence (response order)."""
        return [t.tolist() for t in flat.detach().float().cpu().split(self.response_lens)]


_PER_TOKEN = (
    "loss_mask",
    "advantages",
    "old_logprobs",
    "ref_logprobs",
    "sampler_logprobs",
    "returns",
    "old_values",
)


def _check_sample(i: int, s: TrainSample) -> None:
    r = len(s.response_ids)
    if not s.prompt_ids:
        raise ValueError(
            f"sample {i}: empty prompt_ids; the first response token needs a token to predict it."
        )
    for name in _PER_TOKEN:
        v = getattr(s, name)
        if v is not None and len(v) != r:
            raise ValueError(f"sample {i}: {name} has {len(v)} entries but response_ids has {r}.")


def _optional_flat(samples: Sequence[TrainSample], name: str) -> Tensor | None:
    """Concatenate one optional per-token field over the samples, or None if any sample lacks it."""
    values = [getattr(s, name) for s in samples]
    if any(v is None for v in values):
        return None
    return torch.tensor([x for v in values for x in v], dtype=torch.float32)


def _routes(samples: Sequence[TrainSample]) -> Tensor | None:
    """The samples' recorded experts laid out like the packed row: [N, layers, k] long, -1 for the tokens
    (and samples) without any; None when no sample has them."""
    routed = [s.routed_experts for s in samples]
    first = next((r for r in routed if r is not None), None)
    if first is None:
        return None
    layers, k = first.shape[1:]
    out = torch.full((sum(s.num_tokens for s in samples), layers, k), -1, dtype=torch.long)
    start = 0
    for i, (s, r) in enumerate(zip(samples, routed, strict=True)):
        if r is not None:
            r = torch.as_tensor(r)
            if r.shape[0] > s.num_tokens or tuple(r.shape[1:]) != (layers, k):
                raise ValueError(
                    f"sample {i}: routed_experts has shape {tuple(r.shape)}; expected at most "
                    f"{s.num_tokens} tokens (prompt + response) x {layers} MoE layers x {k} experts."
                )
            out[start : start + r.shape[0]] = r
        start += s.num_tokens
    return out


def _actions(samples: Sequence[TrainSample]) -> tuple[Tensor | None, Tensor | None]:
    """(rows of M holding action placeholders [A], the actions [A, chunk, dim]), or (None, None) when no sample
    has actions. A sample's actions are its loss-mask-1 tokens, in order: their counts must agree (a sample
    without actions keeps its tokens' own logprobs)."""
    if not any(s.actions for s in samples):
        return None, None
    rows: list[int] = []
    chunks: list[list[list[float]]] = []
    start = 0
    for i, s in enumerate(samples):
        sampled = [start + j for j, m in enumerate(s.loss_mask) if m] if s.actions else []
        if len(sampled) != len(s.actions):
            raise ValueError(
                f"sample {i}: {len(s.actions)} actions for {len(sampled)} sampled tokens; an action-head "
                "episode samples exactly one placeholder token per action."
            )
        rows += sampled
        chunks += s.actions
        start += len(s.response_ids)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(chunks)


def pack(samples: Sequence[TrainSample], device: torch.device | str = "cpu") -> PackedBatch:
    """samples (S) -> PackedBatch: one row of N tokens, flat [M] response-token tensors (see module doc),
    built on the host and then moved to `device` (`to_device`)."""
    return to_device(_pack_on_host(samples), device)


def to_device(batch: PackedBatch, device: torch.device | str) -> PackedBatch:
    """`batch` with its tensors on `device`; to a GPU through pinned memory without waiting.

    A plain copy from pageable memory waits until the GPU has run everything queued before it, so a
    micro-batch packed on the device's behalf kept the GPU idle while the host built the next one.
    Asynchronous copies let the host pack micro-batch i + 1 while the GPU still runs micro-batch i (on an
    H200 the 0.5B update's GPU idle fell from 5% to 3%, BENCHMARKS.md); the pinned staging buffers stay
    reserved until their copy has run (PyTorch's caching host allocator records the copy on them)."""
    target = torch.device(device)
    if target.type == "cpu":
        return batch
    pinned = target.type == "cuda"

    def move(t: Tensor) -> Tensor:
        return (t.pin_memory() if pinned else t).to(target, non_blocking=pinned)

    values = {f.name: getattr(batch, f.name) for f in fields(batch)}
    moved: dict[str, Any] = {k: move(v) for k, v in values.items() if isinstance(v, Tensor)}
    return replace(batch, **moved)


def _pack_on_host(samples: Sequence[TrainSample]) -> PackedBatch:
    """`pack` on the CPU (every tensor built here; `to_device` moves them)."""
    ids: list[int] = []
    pos: list[int] = []
    logit_index: list[int] = []
    seq_ids: list[int] = []
    starts: list[int] = []
    for i, s in enumerate(samples):
        _check_sample(i, s)
        starts.append(len(ids))
        start = len(ids) + len(s.prompt_ids)
        ids.extend(s.prompt_ids)
        ids.extend(s.response_ids)
        pos.extend(range(s.num_tokens))
        logit_index.extend(range(start - 1, start - 1 + len(s.response_ids)))
        seq_ids.extend([i] * len(s.response_ids))

    def flat(name: str) -> list[float]:
        return [float(x) for s in samples for x in getattr(s, name)]

    def long(data: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.long)

    action_rows, actions = _actions(samples)

    return PackedBatch(
        input_ids=long([ids]),
        position_ids=long([pos]),
        logit_index=long(logit_index),
        targets=long([t for s in samples for t in s.response_ids]),
        loss_mask=torch.tensor(flat("loss_mask"), dtype=torch.float32),
        advantages=torch.tensor(flat("advantages"), dtype=torch.float32),
        seq_ids=long(seq_ids),
        old_logprobs=_optional_flat(samples, "old_logprobs"),
        ref_logprobs=_optional_flat(samples, "ref_logprobs"),
        sampler_logprobs=_optional_flat(samples, "sampler_logprobs"),
        response_lens=[len(s.response_ids) for s in samples],
        returns=_optional_flat(samples, "returns"),
        old_values=_optional_flat(samples, "old_values"),
        cu_seqlens=torch.tensor(starts + [len(ids)], dtype=torch.int32),
        max_seqlen=max((s.num_tokens for s in samples), default=0),
        seq_images=[tuple(s.images) for s in samples],
        routed_experts=_routes(samples),
        action_rows=action_rows,
        actions=actions,
    )
