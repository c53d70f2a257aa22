"""Per-token logprobs (and entropy) of the response tokens of a packed micro-batch, without the full logits.

A [tokens, vocab] fp32 logits tensor is the largest activation of an LLM update (8k tokens x 152k vocab x 4 B
= 5 GB). So we run only the backbone (`model.get_decoder()`), keep the M hidden rows that predict response
tokens, and apply the LM head + `log_softmax(logits / T)` in chunks of `chunk_tokens` rows, recomputing each
chunk's logits in backward. A plain bias-free Linear head (every causal LM we load) runs as one autograd
function (`ascent.trainer.head`: one weight cast per micro-batch, the weight gradient summed in fp32 by the
matmuls); any other head (LoRA on the head, a bias) wraps each chunk in `torch.utils.checkpoint`.
Temperature follows the rollout contract: the sampler reports `log_softmax(logits / T)` of the sampled token
and so do we.

A vision-language policy (Qwen2.5-VL, Qwen3-VL) runs its multimodal backbone instead (vision tower, merger,
language model: `ascent.models.multimodal`): the row's images through the vision tower, then the language
model with each sequence's own multimodal RoPE positions; sequences with and without images pack together.
An action-head policy's placeholder tokens (`PackedBatch.action_rows`) are scored by its head instead, from
the same hidden rows (`with_action_logprobs`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ascent.algorithms import entropy_from_logits, sum_pi_squared_from_logits
from ascent.models.action_head import action_head_of, gaussian_entropy
from ascent.models.multimodal import (
    is_vision_language,
    language_model,
    multimodal_backbone,
    packed_inputs_embeds,
    packed_positions,
)
from ascent.models.parallel import run_as_forward
from ascent.models.varlen import attention_kwargs
from ascent.trainer.head import fusable_head, head_logprobs
from ascent.trainer.packing import PackedBatch
from ascent.trainer.sequence_parallel import SequenceParallel, response_hidden

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def unwrap_model(model: nn.Module) -> PreTrainedModel:
    """The Hugging Face causal LM inside `model` (a peft PeftModel is unwrapped; anything else passes)."""
    get_base = getattr(model, "get_base_model", None)
    return cast("PreTrainedModel", get_base() if callable(get_base) else model)


def backbone_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(decoder stack that returns `last_hidden_state`, LM head module) of a causal LM; for a vision-language
    model the backbone includes the vision tower (its `get_decoder()` is the language model alone)."""
    lm = unwrap_model(model)
    if is_vision_language(lm):
        decoder: nn.Module | None = multimodal_backbone(lm)
    else:
        decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else getattr(lm, "model", None)
    head = lm.get_output_embeddings()
    if decoder is None or head is None:
        raise TypeError(f"{type(lm).__name__}: expected a causal LM with get_decoder() and an output head.")
    return decoder, head


def hidden_states(model: nn.Module, packed: PackedBatch) -> Tensor:
    """Backbone forward of the packed row -> final hidden states [N, H] (block-causal via position_ids).

    `attention_mask=None` and `use_cache=False` are both required for transformers to detect packing.
    """
    if is_vision_language(model):
        return multimodal_forward(model, packed)
    decoder, _ = backbone_and_head(model)
    return packed_forward(decoder, packed)


def multimodal_forward(model: Any, packed: PackedBatch) -> Tensor:
    """A vision-language model over one packed row -> last hidden states [N, H]: each distinct image of the
    row through the vision tower once, its features in place of its tokens' embeddings, then the language
    model alone with per-sequence multimodal RoPE positions ([4, 1, N], see `packed_positions`) and, when it
    runs varlen attention, the packer's sequence offsets (the tower keeps SDPA and never sees them).

    `model`: the VL model, or anything whose `.model` is its backbone and `.config` its config (the
    critic's `ValueModel` passes its backbone so)."""
    assert packed.cu_seqlens is not None  # `pack` always sets it
    offsets = packed.cu_seqlens.tolist()
    seq_images = packed.seq_images or [() for _ in packed.response_lens]
    embeds, extra = packed_inputs_embeds(model, packed.input_ids, packed.images)
    lm = language_model(model)
    out = lm(
        input_ids=None,
        inputs_embeds=embeds,
        position_ids=packed_positions(model, packed.input_ids, offsets, seq_images),
        attention_mask=None,
        use_cache=False,
        **extra,
        **attention_kwargs(lm, packed.cu_seqlens, packed.max_seqlen),
    )
    return out.last_hidden_state[0]


def packed_forward(decoder: nn.Module, packed: PackedBatch) -> Tensor:
    """A decoder stack over one packed row -> last hidden states [N, H]; varlen attention gets the packer's
    sequence offsets (`ascent.models.varlen.attention_kwargs`)."""
    out = decoder(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=None,
        use_cache=False,
        **attention_kwargs(decoder, packed.cu_seqlens, packed.max_seqlen),
    )
    return out.last_hidden_state[0]


def _chunk_logprobs(
    head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    """hidden [n, H], targets [n] -> (logprobs [n] fp32, entropy [n] fp32 or an empty tensor).

    z = fp32 logits / T (divided in place); log p = log_softmax(z) at the targets. Peak memory is a few
    [n, V] fp32 buffers, in backward (2.7 GiB measured on an H200 for n = 1024, V = 152k).
    """
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits.div_(temperature)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = entropy_from_logits(logits) if with_entropy else logits.new_zeros(0)
    return logp, ent


def _fused_chunk_logprobs(
    head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    """The same values as `_chunk_logprobs`, written for the compiler: one logsumexp, the target logit and
    (if asked) H = lse - sum softmax * z, which inductor fuses into a few reductions over the bf16 logits
    (no fp32 [n, V] buffer is kept). The entropy carries no gradient here: it is a metric unless
    `entropy_coef != 0`, and then the eager path runs (see `logprobs_from_hidden`)."""
    z = head(hidden).float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, z.new_zeros(0)
    zd, lsed = z.detach(), lse.detach()
    lpd = zd - lsed.unsqueeze(-1)  # log p <= 0: -sum p log p is a sum of terms >= 0 (no cancellation)
    ent = -(torch.exp(lpd) * lpd).sum(-1)
    return logp, ent


@functools.cache
def _compiled_chunk_logprobs() -> Callable[..., tuple[Tensor, Tensor]]:
    return cast(Callable[..., tuple[Tensor, Tensor]], torch.compile(_fused_chunk_logprobs, dynamic=True))


def logprobs_from_hidden(
    head: nn.Module,
    hidden: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    compiled: bool = False,
    entropy_grad: bool = True,
    keep_logits: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """hidden [M, H], targets [M] -> (logprobs [M], entropy [M] | None), chunked over rows (see module doc).

    `compiled`: the per-chunk math runs as torch.compile'd fused kernels. On the checkpointed path (heads
    other than a plain Linear) an entropy that must carry a gradient (`entropy_grad` and `with_entropy`)
    stays eager. `keep_logits`: the plain-Linear head keeps its logits for the backward (`head_logprobs`).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: the trainer needs T > 0 (greedy rollouts use T = 1).")
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    if fusable_head(head):
        lp, ent = head_logprobs(
            head,
            hidden,
            targets,
            temperature=temperature,
            chunk_tokens=chunk_tokens,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            compiled=compiled,
            keep_logits=keep_logits,
        )
        return lp, (ent if with_entropy else None)
    use_ckpt = torch.is_grad_enabled() and hidden.requires_grad
    fused = compiled and not (with_entropy and entropy_grad and use_ckpt)
    fn = _compiled_chunk_logprobs() if fused else _chunk_logprobs
    logps, ents = [], []
    for h, t in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens), strict=True):
        args: tuple[Any, ...] = (head, h, t, temperature, with_entropy)
        lp, ent = checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def token_logprobs(
    model: nn.Module,
    packed: PackedBatch,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    compiled: bool = False,
    entropy_grad: bool = True,
    sp: SequenceParallel | None = None,
    keep_logits: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Logprobs [M] (fp32) of the packed batch's response tokens under `model`, and entropy [M] if asked.

    Differentiable when grad is enabled. Equal to `log_softmax(model(...).logits / T)` gathered at the
    targets, computed without ever holding more than [chunk_tokens, vocab] logits. A model sharded by
    `ascent.models.parallel` runs this as a forward of its FSDP root (see `run_as_forward`). `sp`: the ranks
    of a sequence-parallel group share the row (`ascent.trainer.sequence_parallel`); each gets all [M].
    """
    kwargs = {
        "temperature": temperature,
        "chunk_tokens": chunk_tokens,
        "with_entropy": with_entropy,
        "compiled": compiled,
        "entropy_grad": entropy_grad,
        "keep_logits": keep_logits,
    }
    return run_as_forward(model, _token_logprobs, model, packed, sp, **kwargs)


def _response_rows(
    model: nn.Module, packed: PackedBatch, sp: SequenceParallel | None
) -> tuple[Tensor, Tensor, Callable[[Tensor], Tensor]]:
    """(hidden rows predicting response tokens [m, H], their targets [m], per-row values [m] -> [M]): all
    M rows, or with `sp` this rank's share of them and the group's gather."""
    if sp is None:
        hidden = hidden_states(model, packed).index_select(0, packed.logit_index)
        return hidden, packed.targets, lambda x: x
    decoder, _ = backbone_and_head(model)
    return response_hidden(decoder, packed, sp)


def _token_logprobs(
    model: nn.Module, packed: PackedBatch, sp: SequenceParallel | None, **kwargs: Any
) -> tuple[Tensor, Tensor | None]:
    _, head = backbone_and_head(model)
    hidden, targets, gather = _response_rows(model, packed, sp)
    lp, ent = logprobs_from_hidden(head, hidden, targets, **kwargs)
    if sp is None:  # an action head runs on one rank without sequence parallelism (config rules)
        return with_action_logprobs(model, packed, hidden, lp, ent)
    return gather(lp), (None if ent is None else gather(ent))


def with_action_logprobs(
    model: nn.Module, packed: PackedBatch, hidden: Tensor, logp: Tensor, ent: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """hidden [M, H] (the rows predicting the response tokens), logp [M], ent [M] | None -> the same with
    the action placeholders' rows replaced by the action head's log-probability of their chunks (and the
    chunk's entropy): an action is scored like a one-token turn (`ascent.models.action_head`). Unchanged
    without actions."""
    if packed.action_rows is None or packed.actions is None:
        return logp, ent
    head = action_head_of(model)
    if head is None:
        raise ValueError(
            "the batch carries action chunks but the policy has no action head (model.action_head)"
        )
    rows = packed.action_rows
    logp = logp.index_put((rows,), head.log_prob(hidden.index_select(0, rows), packed.actions))
    if ent is not None:
        chunk_entropy = gaussian_entropy(head.log_std, head.chunk).to(ent.dtype)
        ent = ent.index_put((rows,), chunk_entropy.expand(rows.shape[0]))
    return logp, ent


def token_logprobs_and_sum_pi_squared(
    model: nn.Module,
    packed: PackedBatch,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    compiled: bool = False,
    sp: SequenceParallel | None = None,
) -> tuple[Tensor, Tensor]:
    """(logprobs [M], Σπ² [M]) of the packed batch's response tokens, one backbone forward, no grad: the
    logprobs are `token_logprobs`' (the same function on the same hidden states), Σπ² = Σ_v softmax(z / T)_v²
    of each response row, what the optimal-token baseline needs (`ascent.algorithms.otb`). The second
    statistic costs one more LM-head matmul over the response rows, in chunks of `chunk_tokens`."""
    return run_as_forward(
        model,
        _token_logprobs_and_sum_pi_squared,
        model,
        packed,
        sp,
        temperature=temperature,
        chunk_tokens=chunk_tokens,
        compiled=compiled,
    )


def _token_logprobs_and_sum_pi_squared(
    model: nn.Module,
    packed: PackedBatch,
    sp: SequenceParallel | None,
    *,
    temperature: float,
    chunk_tokens: int,
    compiled: bool,
) -> tuple[Tensor, Tensor]:
    _, head = backbone_and_head(model)
    hidden, targets, gather = _response_rows(model, packed, sp)
    logp, _ = logprobs_from_hidden(
        head, hidden, targets, temperature=temperature, chunk_tokens=chunk_tokens, compiled=compiled
    )
    logp, _ = with_action_logprobs(model, packed, hidden, logp, None)
    sums = [sum_pi_squared_from_logits(head(h).float() / temperature) for h in hidden.split(chunk_tokens)]
    return gather(logp), gather(torch.cat(sums) if sums else hidden.new_zeros(0, dtype=torch.float32))
