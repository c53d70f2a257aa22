"""What the fast engine needs to know about a Hugging Face decoder: sizes, norms, biases and RoPE tables.

`spec_from_config` finds the config's model family (`ascent.models.families`, where `ModelSpec` and each
family's spec reader live) and checks that the engine has its implementation, then reads a flat `ModelSpec`;
`rope_tables` turns the config's `rope_parameters` into cos/sin tables indexed by position, computed the
way transformers computes them (fp32 angles, cast to the hidden states' dtype: the embedding table's, fp32 for
the engine's own weights), so our forward matches HF's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ascent.models.families import FAMILIES, Family, ModelSpec, model_type_of
from ascent.rollout.fast.weights import IMPLEMENTATIONS

if TYPE_CHECKING:  # transformers is imported where a model is loaded, not here
    from transformers import PretrainedConfig

# RoPE variants whose frequencies do not depend on the sequence length at run time.
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3")


def supported_model_types() -> list[str]:
    """The model_types whose family names a fast engine implementation, sorted."""
    return sorted(t for t, f in FAMILIES.items() if f.engine in IMPLEMENTATIONS and f.spec is not None)


def engine_family(config: Any) -> Family:
    """The family of a transformers config, if the fast engine runs it; raises ValueError naming the fixes."""
    model_type = model_type_of(config)
    family = FAMILIES.get(model_type)
    if family is None or family.engine not in IMPLEMENTATIONS or family.spec is None:
        known = "no model family" if family is None else f"family {family.name!r} has no fast implementation"
        raise ValueError(
            f"model_type={model_type!r}: {known}; the fast rollout engine runs {supported_model_types()}. "
            "Use rollout.engine=reference for other architectures, or add one under ascent/models/families/."
        )
    return family


def spec_from_config(config: PretrainedConfig) -> ModelSpec:
    """A transformers config -> ModelSpec, read by its model family; raises for what the engine does not
    run."""
    spec = engine_family(config).spec
    assert spec is not None  # engine_family checked it
    return spec(config)


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
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # deferred: transformers, slow to import

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
