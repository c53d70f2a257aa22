"""Tiny vision-language checkpoints: a small Qwen2.5-VL or Qwen3-VL with a character tokenizer and a real
image processor, on disk (design: "Model families"; the vision-language sibling of `tiny.py`).

`make_tiny_vl_checkpoint(dir)` writes what a real Qwen-VL directory holds: config.json and
model.safetensors, tokenizer.json with the vision special tokens (`<|vision_start|>`, `<|image_pad|>`, ...)
and a chat template that renders OpenAI-style content parts, and preprocessor_config.json for the image
processor (Qwen2-VL's, whose pixel budget `min_pixels`/`max_pixels` decides how many image tokens an image
becomes). ascent loads the tokenizer and the image processor separately (`AutoTokenizer`,
`AutoImageProcessor`) and expands each image's `<|image_pad|>` itself, so no video processor (and with it no
torchvision) is needed; the checkpoint is read through the ordinary `from_pretrained` path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ascent.models.tiny import DEFAULT_CHARS, make_char_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Content parts: a string, or a list of {"type": "text", "text": ...} and {"type": "image"} parts (the
# placeholder the caller expands to the image's token count). Roles by first letter, as in tiny.py.
VL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'][0] }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' or p['type'] == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>a{% endif %}"
)

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # the checkpoint's dtype on disk (torch's names)
VLFamily = Literal["qwen2_5_vl", "qwen3_vl"]
PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16}  # the vision tower's patch size per family

# Qwen2.5-VL-3B-Instruct's dimensions (its config.json), for a random-weight model of the real size over a
# small tokenizer: `make_tiny_vl_checkpoint(..., text=QWEN2_5_VL_3B_TEXT, vision=QWEN2_5_VL_3B_VISION)`.
QWEN2_5_VL_3B_TEXT: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
}
QWEN2_5_VL_3B_VISION: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "window_size": 112,
}


def _text_config(vocab: int, hidden: int, layers: int, tokenizer) -> dict:
    return {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }


def _config(
    family: VLFamily,
    tokenizer,
    hidden: int,
    layers: int,
    vision_hidden: int,
    text_shape: Mapping[str, Any] | None = None,
    vision_shape: Mapping[str, Any] | None = None,
):
    """The transformers config of a tiny `family` model over `tokenizer` (mrope sections sum to head_dim/2);
    `text_shape` / `vision_shape` replace the tiny dimensions (e.g. QWEN2_5_VL_3B_TEXT / _VISION)."""
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig  # deferred: transformers, slow to import

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = _text_config(len(tokenizer), hidden, layers, tokenizer) | dict(text_shape or {})
    if text_shape and "head_dim" not in text_shape:
        text["head_dim"] = text["hidden_size"] // text["num_attention_heads"]
    half = text["head_dim"] // 2
    sections = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    tokens = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": True,
    }
    vision: dict[str, Any] = {
        "depth": 2,
        "hidden_size": vision_hidden,
        "intermediate_size": 2 * vision_hidden,
        "num_heads": 2,
        "out_hidden_size": text["hidden_size"],
        "patch_size": PATCH[family],
    }
    if family == "qwen2_5_vl":
        text["rope_scaling"] = {"type": "mrope", "mrope_section": sections}
        vision |= {"fullatt_block_indexes": [1], "window_size": 4 * PATCH[family]} | dict(vision_shape or {})
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": sections, "mrope_interleaved": True}
    vision |= {"deepstack_visual_indexes": [0], "num_position_embeddings": 64}
    return Qwen3VLConfig(text_config=text, vision_config=vision, **tokens)


def _image_processor_class() -> Any:
    """Qwen2-VL's image processor: the PIL implementation where transformers has one (>= 5.2x, no
    torchvision needed), else the single class of older releases."""
    # deferred: transformers, slow to import
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil
    except ImportError:
        from transformers import Qwen2VLImageProcessor

        return Qwen2VLImageProcessor


def make_tiny_vl_checkpoint(
    out_dir: str | Path,
    *,
    family: VLFamily = "qwen2_5_vl",
    hidden_size: int = 64,
    num_layers: int = 2,
    vision_hidden_size: int = 32,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    chars: str = DEFAULT_CHARS,
    words: Sequence[str] = (),
    seed: int = 0,
    text: Mapping[str, Any] | None = None,
    vision: Mapping[str, Any] | None = None,
    dtype: Literal["fp32", "bf16"] = "fp32",
    device: str = "cpu",
) -> Path:
    """Write a randomly initialised tiny `family` vision-language model, its tokenizer and its image
    processor to `out_dir`; return the path. The pixel budget defaults to 4..64 merged patches per image
    (a 2x2 merge of patch_size pixels each), so test images become 4 to 64 image tokens. `text` / `vision`
    (Qwen2.5-VL only for `vision`) replace the tiny dimensions, e.g. QWEN2_5_VL_3B_TEXT / _VISION for the
    real 3B shape; such a model is best initialised on `device="cuda"` and written in `dtype="bf16"`."""
    if vision and family != "qwen2_5_vl":
        raise ValueError(f"vision shape given for family={family!r}: only qwen2_5_vl takes one")
    # deferred: torch and transformers, slow to import
    import torch
    from transformers import AutoModelForImageTextToText

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_char_tokenizer(out, chars, words, special=VISION_TOKENS, chat_template=VL_CHAT_TEMPLATE)
    unit = (2 * PATCH[family]) ** 2  # pixels of one image token (a 2x2 merge of patches)
    _image_processor_class()(
        patch_size=PATCH[family],
        merge_size=2,
        min_pixels=min_pixels or 4 * unit,
        max_pixels=max_pixels or 64 * unit,
    ).save_pretrained(str(out))
    config = _config(family, tokenizer, hidden_size, num_layers, vision_hidden_size, text, vision)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=getattr(torch, DTYPES[dtype]))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out
