"""Shared by the vision-language tests of the engine and the trainer: image prompts for a tiny Qwen-VL model.

`image_prompt(codec, tokenizer, k, seed)` renders a chat prompt with `k` images (different sizes, so the
image-token runs and mrope grids differ) and expands its image pads; `VL_FAMILIES` are the families tested.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from ascent.messages import ImageInput
from ascent.models.vision import ImageCodec

VL_FAMILIES = ("qwen2_5_vl", "qwen3_vl")
SIZES = ((60, 90), (120, 50), (40, 40))


def random_image(h: int, w: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def image_prompt(
    codec: ImageCodec, tokenizer, k: int, seed: int = 0
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """A user turn with `k` images then text -> (expanded prompt ids, its images)."""
    parts: list[dict] = [{"type": "image"} for _ in range(k)] + [{"type": "text", "text": f"what {seed}?"}]
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=True
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    images = tuple(
        codec.encode(random_image(*SIZES[(seed + j) % len(SIZES)], seed=10 * seed + j), f"image {j}")
        for j in range(k)
    )
    return codec.expand(ids, images), images
