"""The tiny vision-language checkpoints and the image codec: what a real Qwen-VL directory holds, read back
through from_pretrained, images become the token count the pixel budget says, and the model runs on them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoTokenizer

from ascent.models.tiny import make_tiny_checkpoint
from ascent.models.tiny_vl import (
    QWEN2_5_VL_3B_TEXT,
    QWEN2_5_VL_3B_VISION,
    _config,
    make_tiny_vl_checkpoint,
)
from ascent.models.vision import ImageCodecError, load_image_codec, model_inputs
from tests.unit.vl_files import make_vl_processor_dir


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vl_dir(request, tmp_path_factory):
    return make_tiny_vl_checkpoint(tmp_path_factory.mktemp(request.param), family=request.param)


def _image(h: int, w: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_checkpoint_holds_what_a_real_one_does(vl_dir):
    names = {p.name for p in vl_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"} <= names


def test_pixel_budget_bounds_the_token_count(vl_dir):
    codec = load_image_codec(vl_dir)
    small, large = codec.encode(_image(20, 20)), codec.encode(_image(900, 700))
    assert small.num_tokens == 4  # raised to min_pixels
    assert 32 <= large.num_tokens <= 64  # lowered to max_pixels
    t, h, w = large.grid_thw
    assert large.num_tokens == t * h * w // 4 and large.pixel_values.shape[0] == t * h * w
    tight = load_image_codec(vl_dir, max_pixels=small.num_tokens * (small.pixel_values.shape[1] // 3) * 4)
    assert tight.encode(_image(900, 700)).num_tokens < large.num_tokens


def test_same_pixels_same_digest(vl_dir):
    codec = load_image_codec(vl_dir)
    assert codec.encode(_image(50, 60, 1)).digest == codec.encode(_image(50, 60, 1)).digest
    assert codec.encode(_image(50, 60, 1)).digest != codec.encode(_image(50, 60, 2)).digest


def test_expanded_prompt_runs_through_the_model(vl_dir):
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    codec = load_image_codec(vl_dir)
    tokenizer = AutoTokenizer.from_pretrained(vl_dir)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    images = [codec.encode(_image(100, 140))]
    expanded = codec.expand(ids, images)
    assert expanded.count(codec.image_token_id) == images[0].num_tokens
    model = AutoModelForImageTextToText.from_pretrained(vl_dir)
    x = torch.tensor([expanded])
    logits = model(
        input_ids=x, mm_token_type_ids=(x == codec.image_token_id).int(), **model_inputs(images)
    ).logits
    assert logits.shape == (1, len(expanded), len(tokenizer))
    with pytest.raises(ImageCodecError, match="1 image placeholders for 2 images"):
        codec.expand(ids, images * 2)


def test_text_checkpoint_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ImageCodecError, match="not a vision-language checkpoint"):
        load_image_codec(make_tiny_checkpoint(tmp_path))


def test_the_3b_shape_has_qwen2_5_vl_3b_dimensions(tmp_path):
    """QWEN2_5_VL_3B_*: Qwen2.5-VL-3B's layers over any tokenizer (its 3.75B parameters less its 151936 x
    2048 embedding), the multimodal RoPE sections of its 128-wide heads, the vision tower feeding the text."""
    tok = AutoTokenizer.from_pretrained(make_vl_processor_dir(tmp_path))
    config = _config("qwen2_5_vl", tok, 64, 2, 32, QWEN2_5_VL_3B_TEXT, QWEN2_5_VL_3B_VISION)
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.head_dim) == (2048, 36, 128)
    assert text.rope_scaling["mrope_section"] == [16, 24, 24]
    assert (vision.depth, vision.hidden_size, vision.out_hidden_size) == (32, 1280, 2048)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    without_embedding = sum(p.numel() for p in model.parameters()) - len(tok) * 2048
    assert round(without_embedding / 1e9, 2) == round(3.75 - 151936 * 2048 / 1e9, 2) == 3.44


def test_a_release_whose_auto_class_wants_torchvision_gets_the_pil_processor(tmp_path, monkeypatch):
    """transformers 5.17's AutoImageProcessor raises ImportError without torchvision (the GPU machine has
    none): the codec then names the PIL implementation itself."""

    def wants_torchvision(*args, **kwargs):
        raise ImportError("AutoImageProcessor requires the Torchvision library")

    monkeypatch.setattr(transformers.AutoImageProcessor, "from_pretrained", wants_torchvision)
    codec = load_image_codec(make_vl_processor_dir(tmp_path))
    assert type(codec.processor).__name__ == "Qwen2VLImageProcessorPil"
    assert codec.encode(_image(20, 20)).num_tokens == 4
