"""How per-token losses become one number (`LOSS_AGGREGATIONS`), split-invariant by construction.

Contract: `LOSS_AGGREGATIONS[name](per_token_loss [N], mask [N], seq_ids [N], *, total_tokens, total_seqs,
max_len) -> scalar`, the micro-batch's *share* of the mini-batch loss. The denominators are mini-batch totals
(over all micro-batches and all workers): `total_tokens` = unmasked tokens, `total_seqs` = sequences,
`max_len` = the fixed length divisor of Dr. GRPO. Numerators are sums over this micro-batch only, so summing
the shares over any split (micro-batches x workers) gives exactly the mini-batch loss and its gradient. With
data parallelism that averages gradients over W workers, multiply each share by W (or divide the totals by W).

Each sequence must lie whole inside one micro-batch (true for packing); `seq_ids` numbers the micro-batch's
sequences 0..S-1 and may carry any id on masked padding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ascent.algorithms.utils import masked_sum, segment_sum


def _den(x: float | int | Tensor) -> float | Tensor:
    """A safe denominator: at least 1 (so an empty mini-batch gives 0, not NaN)."""
    return x.clamp(min=1) if isinstance(x, Tensor) else max(float(x), 1.0)


def token_mean(
    per_token_loss: Tensor, mask: Tensor, seq_ids: Tensor, *, total_tokens: Any, **_: Any
) -> Tensor:
    """sum(loss * mask) / total_tokens: every token weighs the same (DAPO, Yu et al. 2025)."""
    return masked_sum(per_token_loss, mask) / _den(total_tokens)


def token_sum(per_token_loss: Tensor, mask: Tensor, seq_ids: Tensor, **_: Any) -> Tensor:
    """sum(loss * mask), no divisor: the mini-batch's loss is the sum over all its tokens (Tinker's losses,
    e.g. DRO; verl's `seq-mean-token-sum` times the number of sequences). The gradient's scale grows with
    the tokens in a mini-batch: lower the learning rate to match (roughly by the tokens per mini-batch)."""
    return masked_sum(per_token_loss, mask)


def seq_mean_token_sum(
    per_token_loss: Tensor, mask: Tensor, seq_ids: Tensor, *, total_seqs: Any, **_: Any
) -> Tensor:
    """sum over sequences of (sum of the sequence's token losses) / total_seqs."""
    return masked_sum(per_token_loss, mask) / _den(total_seqs)


def seq_mean_token_mean(
    per_token_loss: Tensor, mask: Tensor, seq_ids: Tensor, *, total_seqs: Any, **_: Any
) -> Tensor:
    """sum over sequences of (mean of the sequence's token losses) / total_seqs (original GRPO, Shao et al.
    2024).

    A sequence with no unmasked token contributes 0.
    """
    sums = segment_sum(per_token_loss, seq_ids, mask)
    counts = segment_sum(mask.to(per_token_loss.dtype), seq_ids, mask)
    return (sums / counts.clamp(min=1.0)).sum() / _den(total_seqs)


def seq_mean_token_sum_norm(
    per_token_loss: Tensor, mask: Tensor, seq_ids: Tensor, *, total_seqs: Any, max_len: Any, **_: Any
) -> Tensor:
    """sum(loss * mask) / (total_seqs * max_len): a constant length divisor (Dr. GRPO, Liu et al. 2025)."""
    return masked_sum(per_token_loss, mask) / (_den(total_seqs) * _den(max_len))


LOSS_AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token-mean": token_mean,
    "token-sum": token_sum,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
