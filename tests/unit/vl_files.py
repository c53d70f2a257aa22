"""A vision-language checkpoint's processing files without its weights, for tests that render images into
token ids (data, doctor, server): the tiny VL tokenizer and chat template, Qwen2-VL's image processor and a
config.json naming the image token. Written in milliseconds, where a whole tiny checkpoint takes seconds."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from ascent.models.tiny import make_char_tokenizer
from ascent.models.tiny_vl import PATCH, VISION_TOKENS, VL_CHAT_TEMPLATE

UNIT = (2 * PATCH["qwen2_5_vl"]) ** 2  # pixels of one image token (a 2x2 merge of 14-pixel patches)


def make_vl_processor_dir(out: Path) -> Path:
    """Tokenizer, image processor (4..64 image tokens per image) and config.json's image_token_id in `out`."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    tok = make_char_tokenizer(out, special=VISION_TOKENS, chat_template=VL_CHAT_TEMPLATE)
    Qwen2VLImageProcessorPil(
        patch_size=14, merge_size=2, min_pixels=4 * UNIT, max_pixels=64 * UNIT
    ).save_pretrained(str(out))
    config = {"model_type": "qwen2_5_vl", "image_token_id": tok.convert_tokens_to_ids("<|image_pad|>")}
    (out / "config.json").write_text(json.dumps(config))
    return out


def png_bytes(h: int, w: int, seed: int = 0) -> bytes:
    """A random RGB image of h x w pixels, PNG-encoded."""
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()
