"""What the Llama-like families (Qwen2, Qwen3, Llama, Mistral) share: the fast engine's "decoder" layout.

They differ only in details the engine reads from the config or the checkpoint itself: q/k/v biases
(Qwen2), q/k RMSNorms (Qwen3), the RoPE variant (Llama 3's `llama3`), a sliding window (Mistral, Qwen2).
Their checkpoint names (`model.layers.N.self_attn.q_proj.weight`, ...) are the engine's names as they are.
"""

from __future__ import annotations

from typing import Any

from ascent.models.families.family import Family
from ascent.models.families.spec import ModelSpec

ENGINE = "decoder"  # the fast engine's implementation for this layout


def sliding_window(config: Any) -> int | None:
    """The attention window the config actually uses, or None (Qwen2/3 switch it with use_sliding_window)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def decoder_spec(config: Any) -> ModelSpec:
    """A Llama-like transformers config -> ModelSpec; raises ValueError for an MLP the engine lacks."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r}: the fast engine implements SwiGLU (silu) MLPs only.")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return ModelSpec(
        model_type=getattr(config, "model_type", "?"),
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
        sliding_window=sliding_window(config),
    )


def llama_like(name: str, *model_types: str) -> Family:
    """A text family with the Llama layout: a causal LM, a tokenizer, the engine's decoder, same names."""
    return Family(name=name, model_types=model_types or (name,), engine=ENGINE, spec=decoder_spec)
