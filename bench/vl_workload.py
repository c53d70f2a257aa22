"""The vision-language workload shared by bench/vl_e2e.py (ours) and bench/trl_vl_baseline.py (TRL).

A random-weight Qwen2.5-VL checkpoint (`--shape 3b`: Qwen2.5-VL-3B's dimensions, vision tower included, bf16
on disk; `tiny` for a CPU check) written with `save_pretrained` beside ascent's character tokenizer with the
vision special tokens and Qwen2-VL's image processor at a fixed pixel budget (`--image-size` squared: 448 px
gives 256 image tokens per image), and rows of one synthetic image (random blocks, PNG) plus a short
question, written as JSONL for ascent (image parts by path) and kept as PIL images for TRL. The reward is
bench/e2e_workload.py's coin flip on the response ids.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_workload as W  # noqa: E402

VOCAB = 151936
TEXT = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16),
}
VISION = {
    "tiny": dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, fullatt_block_indexes=[1]),
    "3b": dict(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        fullatt_block_indexes=[7, 15, 23, 31],
    ),
}
coin_reward = W.coin_reward


def vl_config(shape: str, tokenizer: Any) -> Any:
    from transformers import Qwen2_5_VLConfig

    from ascent.models.tiny_vl import VISION_TOKENS

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = TEXT[shape]
    head = text["hidden_size"] // text["num_attention_heads"]
    quarter = head // 2 * 3 // 8
    return Qwen2_5_VLConfig(
        text_config={
            **text,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
            "max_position_embeddings": 32768,
            "rope_theta": 1000000.0,
            "rope_scaling": {"type": "mrope", "mrope_section": [head // 2 - 2 * quarter, quarter, quarter]},
            "tie_word_embeddings": True,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": None,
        },
        vision_config={
            **VISION[shape],
            "out_hidden_size": text["hidden_size"],
            "patch_size": 14,
            "window_size": 112,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def make_checkpoint(root: Path, shape: str, image_size: int, device: str) -> Path:
    """Write (once) the random-weight `shape` checkpoint with tokenizer and image processor under root."""
    from transformers import AutoModelForImageTextToText

    from ascent.models.tiny import make_char_tokenizer
    from ascent.models.tiny_vl import VISION_TOKENS, VL_CHAT_TEMPLATE, _image_processor_class

    out = root / f"vl_{shape}_{image_size}"
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_char_tokenizer(out, special=VISION_TOKENS, chat_template=VL_CHAT_TEMPLATE)
    pixels = image_size * image_size
    _image_processor_class()(
        patch_size=14, merge_size=2, min_pixels=pixels, max_pixels=pixels
    ).save_pretrained(str(out))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(vl_config(shape, tokenizer), dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def images(n: int, size: int, seed: int = 0) -> list[Any]:
    """n RGB images of size x size: random 28-px blocks of colour."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    blocks = size // 28
    out = []
    for _ in range(n):
        small = rng.integers(0, 256, (blocks, blocks, 3), dtype=np.uint8)
        out.append(Image.fromarray(np.kron(small, np.ones((28, 28, 1), dtype=np.uint8))))
    return out


def question(rng: random.Random) -> str:
    return "describe " + "".join(rng.choices(W.CHARS, k=24))


def write_rows(root: Path, n: int, size: int) -> Path:
    """n JSONL rows, each one image (a PNG beside the file, referenced by relative path) and a question."""
    folder = root / f"vl_rows_{size}"
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lines = []
    for i, image in enumerate(images(n, size)):
        image.save(folder / f"{i}.png")
        content = [{"type": "image", "image": f"{i}.png"}, {"type": "text", "text": question(rng)}]
        lines.append(json.dumps({"prompt": [{"role": "user", "content": content}], "answer": "0"}))
    path = folder / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
