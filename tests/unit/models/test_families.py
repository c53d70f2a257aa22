"""The model-family registry: the four text families, the two vision-language ones, the error for an unknown model_type, name mappings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ascent.errors import AscentError
from ascent.models.families import CAUSAL_LM, FAMILIES, Family, UnknownFamilyError, family_for, resolve_class
from ascent.models.loading import family_of_dir

TEXT_FAMILIES = ("qwen2", "qwen3", "llama", "mistral")
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


def tiny_model(model_type: str) -> torch.nn.Module:
    """A two-layer causal LM of `model_type` with random weights (no files, no hub)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SIZES))


@pytest.mark.parametrize("model_type", TEXT_FAMILIES)
def test_each_text_family_is_registered_with_the_decoder_engine(model_type):
    family = family_for(model_type)
    assert family is FAMILIES[model_type] and family.name == model_type
    assert family.engine == "decoder" and family.spec is not None
    assert family.trainer_class == "AutoModelForCausalLM" and not family.is_multimodal


@pytest.mark.parametrize("model_type", TEXT_FAMILIES)
def test_spec_reads_the_config_of_its_family(model_type):
    model = tiny_model(model_type)
    family = family_for(model.config)
    assert family.spec is not None
    spec = family.spec(model.config)
    assert (spec.model_type, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (model_type, 2, 4, 2)
    assert spec.head_dim == 8 and spec.group_size == 2


@pytest.mark.parametrize("model_type", TEXT_FAMILIES)
def test_weight_names_round_trip(model_type):
    family = family_for(model_type)
    names = list(tiny_model(model_type).state_dict())
    assert any(".self_attn.q_proj.weight" in n for n in names)
    assert [family.to_checkpoint_name(family.to_engine_name(n)) for n in names] == names


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen3_vl"])
def test_vision_language_families_load_as_image_text_models(model_type, tmp_path):
    from ascent.models.loading import load_model
    from ascent.models.multimodal import is_vision_language
    from ascent.models.tiny_vl import make_tiny_vl_checkpoint

    family = family_for(model_type)
    assert family.trainer_class == "AutoModelForImageTextToText" and family.is_multimodal
    model = load_model(make_tiny_vl_checkpoint(tmp_path, family=model_type), device="cpu")
    assert type(model).__name__.endswith("ForConditionalGeneration") and is_vision_language(model)
    assert resolve_class(family.processor_class or "").__name__ == "AutoImageProcessor"
    # the fast engine runs the language model as its decoder, with multimodal RoPE, and the tower as is
    assert family.engine == "decoder" and family.spec is not None
    spec = family.spec(model.config)
    assert spec.mrope_section == (2, 3, 3) and spec.mrope_interleaved == (model_type == "qwen3_vl")
    names = list(model.state_dict())
    engine_names = {family.to_engine_name(n) for n in names}
    assert "model.layers.0.self_attn.q_proj.weight" in engine_names
    assert any(n.startswith("model.visual.") for n in engine_names)
    assert [family.to_checkpoint_name(family.to_engine_name(n)) for n in names] == names


def test_unknown_model_type_names_it_the_known_families_and_the_fix():
    with pytest.raises(UnknownFamilyError) as err:
        family_for({"model_type": "gpt2"})
    message = str(err.value)
    assert "model_type='gpt2'" in message and "ascent/models/families/" in message
    assert all(t in message for t in TEXT_FAMILIES)
    assert isinstance(err.value, AscentError) and err.value.exit_code == 2


def test_a_new_family_is_one_registry_entry(monkeypatch):
    toy = Family(name="toy", model_types=("toy", "toy_moe"), processor_class="AutoProcessor")
    for model_type in toy.model_types:
        monkeypatch.setitem(FAMILIES, model_type, toy)
    assert family_for("toy_moe") is toy and toy.is_multimodal and toy.engine is None


def test_loading_picks_the_family_of_a_checkpoint_directory(tmp_path: Path):
    assert family_of_dir(tmp_path) is CAUSAL_LM  # no config.json: a bare tokenizer directory
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert family_of_dir(tmp_path) is FAMILIES["qwen3"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert family_of_dir(tmp_path) is CAUSAL_LM  # loads as a plain causal LM, as before families existed


def test_resolve_class_takes_transformers_names_and_import_paths():
    from transformers import AutoModelForCausalLM

    assert resolve_class("AutoModelForCausalLM") is AutoModelForCausalLM
    assert resolve_class("ascent.models.families:Family") is Family
