"""What the fast engine needs to know about a Hugging Face decoder: sizes, norms, biases and RoPE tables.

`spec_from_config` reads a transformers config (Qwen2, Qwen3, Llama, Mistral) into a flat `ModelSpec`;
`rope_tables` turns the config's `rope_parameters` into cos/sin tables indexed by position, computed the
way transformers computes them (fp32 angles, cast to the hidden states' dtype: the embedding table's, fp32 for
the engine's own weights), so our forward matches HF's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
# RoPE variants whose frequencies do not depend on the sequence length at run time.
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3")


@dataclass(frozen=True)
class ModelSpec:
    """Flat architecture facts of a decoder-only LM with RMSNorm, RoPE, GQA attention and a SwiGLU MLP."""

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

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes of K and V cache one token takes across all layers."""
        return 2 * self.num_layers * self.kv_size * torch.empty((), dtype=dtype).element_size()


def _sliding_window(config: Any) -> int | None:
    """The attention window the config actually uses, or None (Qwen2/3 switch it with use_sliding_window)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def spec_from_config(config: Any) -> ModelSpec:
    """A transformers config (Qwen2/Qwen3/Llama/Mistral) -> ModelSpec; raises for what we do not run."""
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type={model_type!r}: the fast rollout engine runs {list(SUPPORTED_MODEL_TYPES)}; "
            "use rollout.engine=reference for other architectures."
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r}: the fast engine implements SwiGLU (silu) MLPs only.")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return ModelSpec(
        model_type=model_type,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_eps=float(config.rms_norm_eps),
        max_position_embeddings=int(config.max_position_embeddings),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        sliding_window=_sliding_window(config),
    )


def _inv_freq(config: Any, spec: ModelSpec) -> tuple[Tensor, float]:
    """inv_freq [head_dim / 2] fp32 and the attention scaling factor, as transformers computes them."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        raise ValueError(
            f"rope_parameters.rope_type={rope_type!r}: the fast engine supports {list(STATIC_ROPE_TYPES)} "
            "(frequencies fixed at load time); use rollout.engine=reference."
        )
    if rope_type == "default":
        theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        dim = spec.head_dim
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


def rope_tables(
    config: Any, spec: ModelSpec, max_len: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """-> cos, sin [max_len, head_dim] in `dtype`: angles in fp32 (position * inv_freq), then cast.

    HF casts them to the hidden states' dtype, which is the embedding table's: pass that (fp32 for the
    engine's own weights, as for a trainer under autocast over fp32 master weights)."""
    inv_freq, scaling = _inv_freq(config, spec)
    pos = torch.arange(max_len, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * scaling).to(dtype=dtype, device=device)
    sin = (emb.sin() * scaling).to(dtype=dtype, device=device)
    return cos, sin
