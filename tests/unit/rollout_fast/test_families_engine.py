"""The fast engine takes its architecture from the model-family registry: the four text families' names are
the engine's, and a new family (here one laid out as a vision-language model's text part) runs on the
engine by one registry entry, its weight names mapped on load and on every publication."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models.families import FAMILIES, Family
from ascent.models.families.llama_like import decoder_spec
from ascent.rollout import ReferenceEngine
from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.spec import spec_from_config, supported_model_types
from ascent.rollout.fast.weights import build_weights, state_dict_of

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
)


def tiny_model(model_type: str) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **SIZES)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama", "mistral"])
def test_the_engine_holds_every_name_its_family_maps_to(model_type):
    assert model_type in supported_model_types()
    model = tiny_model(model_type)
    family = FAMILIES[model_type]
    sd = state_dict_of(model)
    weights = build_weights(
        sd, spec_from_config(model.config), torch.float32, torch.device("cpu"), share=False
    )
    assert set(weights.targets) == {family.to_engine_name(n) for n in sd} | {"lm_head.weight"}


def test_a_family_without_a_fast_implementation_points_to_the_reference_engine(monkeypatch):
    monkeypatch.setitem(FAMILIES, "qwen3", Family(name="qwen3_without_engine", model_types=("qwen3",)))
    with pytest.raises(ValueError, match="qwen3_without_engine.*rollout.engine=reference"):
        spec_from_config(tiny_model("qwen3").config)
    assert "qwen3" not in supported_model_types()


def vl_to_engine(name: str) -> str:
    return name.replace("model.language_model.", "model.", 1)


def vl_to_checkpoint(name: str) -> str:
    return name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name


class LanguageModelInside(nn.Module):
    """A causal LM whose decoder sits at `model.language_model` (as in Qwen2.5-VL checkpoints)."""

    def __init__(self, lm: nn.Module, model_type: str):
        super().__init__()
        self.model = nn.Module()
        self.model.language_model = lm.model
        self.lm_head = lm.lm_head
        self.config = copy.deepcopy(lm.config)
        self.config.model_type = model_type


def greedy(engine) -> list[list[int]]:
    reqs = [GenerationRequest([3, 4, 5, 6], SamplingParams(temperature=0.0, max_new_tokens=8))]
    return [r[0].token_ids for r in engine.generate(reqs)]


def test_a_new_family_runs_on_the_engine_by_one_registry_entry(monkeypatch):
    toy = Family(
        name="toy_vl",
        model_types=("toy_vl",),
        engine="decoder",
        spec=decoder_spec,
        to_engine_name=vl_to_engine,
        to_checkpoint_name=vl_to_checkpoint,
    )
    monkeypatch.setitem(FAMILIES, "toy_vl", toy)
    lm = tiny_model("qwen2")
    with torch.no_grad():
        lm.lm_head.weight.mul_(10.0)  # a peaked head: varied greedy tokens
    wrapped = LanguageModelInside(lm, "toy_vl")
    assert "model.language_model.layers.0.self_attn.q_proj.weight" in state_dict_of(wrapped)
    ref = ReferenceEngine(lm, eos_token_ids=[1], pad_token_id=0)
    fast = build_fast_engine(
        model=wrapped,
        dtype="fp32",
        device="cpu",
        eos_token_ids=[1],
        max_model_len=64,
        share_weights=False,
        page_size=16,
    )
    assert "toy_vl" in supported_model_types() and greedy(fast) == greedy(ref)
    with torch.no_grad():
        for p in lm.model.layers.parameters():
            p.add_(0.3 * torch.randn_like(p))
    fast.update_weights(state_dict_of(wrapped).items())  # published under the checkpoint's names
    assert greedy(fast) == greedy(ref)
