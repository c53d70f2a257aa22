"""Qwen3-MoE (text): the Qwen3 layout (q/k RMSNorms, no q/k/v biases) with a routed mixture of SwiGLU experts
in place of the dense MLP (every `decoder_sparse_step`-th layer not in `mlp_only_layers`).

transformers holds the experts stacked (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
[E, H, I], the router `mlp.gate.weight` [E, H]) and saves them per expert as the released checkpoints do
(`mlp.experts.N.gate_proj.weight`, ...); the fast engine reads either (`ascent.rollout.fast.moe`). The
router picks each token's `num_experts_per_tok` experts by softmax probability, renormalised when
`norm_topk_prob`. Routing replay (`ascent.models.moe`) makes the trainer use the experts the engine chose.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ascent.models.families.family import Family
from ascent.models.families.llama_like import ENGINE, decoder_spec
from ascent.models.families.spec import ModelSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def moe_layers(config: PretrainedConfig) -> tuple[int, ...]:
    """The layers whose MLP is sparse (transformers' rule for Qwen2/3-MoE; every layer of a config without
    the rule's fields, as Mixtral)."""
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    n = int(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0)
    return tuple(
        i for i in range(config.num_hidden_layers) if i not in dense and n > 0 and (i + 1) % step == 0
    )


def qwen3_moe_spec(config: Any) -> ModelSpec:
    """A Qwen3-MoE transformers config -> ModelSpec with its expert facts."""
    return dataclasses.replace(
        decoder_spec(config),
        num_experts=int(config.num_experts),
        experts_per_token=int(config.num_experts_per_tok),
        moe_intermediate_size=int(config.moe_intermediate_size),
        norm_topk_prob=bool(getattr(config, "norm_topk_prob", True)),
        moe_layers=moe_layers(config),
    )


FAMILY = Family(name="qwen3_moe", model_types=("qwen3_moe",), engine=ENGINE, spec=qwen3_moe_spec)
