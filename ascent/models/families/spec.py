"""`ModelSpec`: the flat architecture facts a family's spec reader hands the fast engine (design: "models/").

It lives here, below `rollout`, so a family module can build it from a Hugging Face config without importing
the engine; `ascent.rollout.fast` reads it (sizes of the KV cache, the weights, the forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelSpec:
    """Flat architecture facts of a decoder-only LM with RMSNorm, RoPE, GQA attention and a SwiGLU MLP (or,
    in `moe_layers`, a routed mixture of SwiGLU experts)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    sliding_window: int | None = None
    # multimodal RoPE (vision-language models): rotary frequencies per (time, height, width) position row,
    # in blocks or interleaved (Qwen3-VL); empty for a text model (one position per token)
    mrope_section: tuple[int, ...] = ()
    mrope_interleaved: bool = False
    # Mixture of experts (Qwen3-MoE): 0 experts is a dense model. `moe_layers` are the layers whose MLP is
    # a routed set of `num_experts` SwiGLU experts of width `moe_intermediate_size`, each token through the
    # `experts_per_token` of highest router probability (renormalised to sum 1 when `norm_topk_prob`).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[int, ...] = ()

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and bool(self.moe_layers)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes of K and V cache one token takes across all layers."""
        return 2 * self.num_layers * self.kv_size * torch.empty((), dtype=dtype).element_size()
