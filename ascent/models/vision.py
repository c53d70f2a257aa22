"""Images to model inputs, one way for every stage (data, environments, engines, trainer): `ImageCodec`.

A vision-language checkpoint keeps its image processor in preprocessor_config.json. `load_image_codec(dir)`
reads it (transformers' `AutoImageProcessor`; without torchvision, the PIL implementation, named directly
where the auto class refuses to run without torchvision, as in transformers 5.17) with the checkpoint's
`image_token_id`, and then:

- `encode(image, source)` turns one PIL image (or an RGB uint8 array) into an `ImageInput`: its patches,
  their grid and how many image tokens it becomes under the processor's pixel budget
  (`min_pixels`/`max_pixels`, overridable at load);
- `expand(ids, images)` replaces the single `<|image_pad|>` a chat template writes per image by that many,
  image by image (the ids the engine samples from and the trainer scores);
- `model_inputs(images)` gives the model's `pixel_values` [sum patches, patch_dim] and `image_grid_thw`
  [images, 3] for a list of images, in order.

Processing happens once, where an image enters (a data row, an environment's observation): what travels
after that are the `ImageInput`s, so the engine and the trainer see the same pixels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from ascent.errors import AscentError
from ascent.messages import ImageInput

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class ImageCodecError(AscentError, ValueError):
    """A checkpoint without an image processor or image token, or an image that cannot be encoded."""


@dataclass(frozen=True)
class ImageCodec:
    """A checkpoint's image processor and image token (see the module docstring)."""

    processor: Any
    image_token_id: int
    merge_size: int

    def encode(self, image: Image.Image | np.ndarray, source: str = "") -> ImageInput:
        """One PIL image or RGB uint8 array [H, W, 3] -> its `ImageInput`."""
        pixels = np.array(image.convert("RGB") if isinstance(image, Image.Image) else image, dtype=np.uint8)
        if pixels.ndim != 3 or pixels.shape[2] != 3:
            raise ImageCodecError(f"{source or 'image'}: expected RGB pixels [H, W, 3], got {pixels.shape}")
        out = self.processor(images=[pixels], return_tensors="pt")
        grid = tuple(int(v) for v in out["image_grid_thw"][0])
        digest = hashlib.sha1(pixels.tobytes() + str(pixels.shape).encode()).hexdigest()
        return ImageInput(
            pixel_values=out["pixel_values"].to(torch.float32),
            grid_thw=(grid[0], grid[1], grid[2]),
            num_tokens=grid[0] * grid[1] * grid[2] // self.merge_size**2,
            digest=digest,
            source=source,
        )

    def expand(self, ids: Sequence[int], images: Sequence[ImageInput]) -> list[int]:
        """`ids` with its k-th `<|image_pad|>` repeated `images[k].num_tokens` times; the count of pads must
        equal the count of images."""
        pads = sum(1 for t in ids if t == self.image_token_id)
        if pads != len(images):
            raise ImageCodecError(f"{pads} image placeholders for {len(images)} images")
        out: list[int] = []
        k = 0
        for t in ids:
            if t == self.image_token_id:
                out.extend([t] * images[k].num_tokens)
                k += 1
            else:
                out.append(t)
        return out

    def model_inputs(self, images: Sequence[ImageInput]) -> dict[str, torch.Tensor]:
        """images -> {"pixel_values": [sum patches, patch_dim], "image_grid_thw": [len(images), 3]}."""
        return model_inputs(images)


def model_inputs(images: Sequence[ImageInput]) -> dict[str, torch.Tensor]:
    """images -> {"pixel_values": [sum patches, patch_dim], "image_grid_thw": [len(images), 3]} (empty: {})."""
    if not images:
        return {}
    return {
        "pixel_values": torch.cat([torch.as_tensor(im.pixel_values) for im in images]),
        "image_grid_thw": torch.tensor([im.grid_thw for im in images], dtype=torch.long),
    }


def image_token_id(path: Path) -> int | None:
    """The checkpoint's `image_token_id` from config.json (None for a text-only model)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("image_token_id")
    return int(value) if isinstance(value, int) else None


def load_image_codec(
    path: str | Path, min_pixels: int | None = None, max_pixels: int | None = None
) -> ImageCodec:
    """The `ImageCodec` of the vision-language checkpoint in `path`, with the pixel budget overridden where
    given; raises ImageCodecError naming the missing piece."""
    from transformers import AutoImageProcessor  # deferred: transformers, slow to import

    p = Path(path)
    token = image_token_id(p)
    if token is None or not (p / "preprocessor_config.json").is_file():
        raise ImageCodecError(
            f"{str(p)!r} is not a vision-language checkpoint (no image_token_id in config.json or no "
            "preprocessor_config.json); point model.path at a Qwen2.5-VL/Qwen3-VL directory."
        )
    budget = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    try:
        processor = AutoImageProcessor.from_pretrained(str(p), local_files_only=True, **budget)
    except ImportError:  # transformers releases whose auto class insists on torchvision (5.17)
        processor = _pil_processor_class(p).from_pretrained(str(p), local_files_only=True, **budget)
    problem = processor_problem(_vision_config(p), processor)
    if problem is not None:
        raise ImageCodecError(
            f"model.path={str(p)!r}: {problem}; the image processor belongs to another model. Copy "
            "preprocessor_config.json from the checkpoint these weights came from (Qwen2.5-VL: patch_size 14, "
            "Qwen3-VL: 16; both merge_size 2)."
        )
    return ImageCodec(processor, token, int(getattr(processor, "merge_size", 2)))


def _pil_processor_class(path: Path) -> Any:
    """The PIL implementation (no torchvision) of the image processor preprocessor_config.json names: its
    `...Pil` class where transformers has one, else the named class itself."""
    import transformers  # deferred: transformers, slow to import

    name = str(json.loads((path / "preprocessor_config.json").read_text()).get("image_processor_type", ""))
    name = name.removesuffix("Fast")
    found = getattr(transformers, f"{name}Pil", None) or getattr(transformers, name, None)
    if found is None:
        raise ImageCodecError(
            f"{str(path)!r}: image_processor_type {name!r} in preprocessor_config.json is not a transformers "
            "image processor this release has; install torchvision or point model.path at a Qwen-VL checkpoint."
        )
    return found


# preprocessor_config.json's name -> config.json vision_config's name of the same number
_PROCESSOR_FIELDS = {
    "patch_size": "patch_size",
    "merge_size": "spatial_merge_size",
    "temporal_patch_size": "temporal_patch_size",
}


def _vision_config(path: Path) -> dict[str, Any]:
    try:
        vision = json.loads((path / "config.json").read_text()).get("vision_config")
    except (OSError, ValueError, AttributeError):
        return {}
    return vision if isinstance(vision, dict) else {}


def processor_problem(vision_config: dict[str, Any], processor: Any) -> str | None:
    """What makes `processor` cut images into patches the vision tower (config.json's `vision_config`) does
    not take: a patch size, merge size or temporal patch size that differs; None when they agree (or the
    config does not say)."""
    for ours, theirs in _PROCESSOR_FIELDS.items():
        have, want = getattr(processor, ours, None), vision_config.get(theirs)
        if have is not None and want is not None and int(have) != int(want):
            return (
                f"preprocessor_config.json has {ours}={have}, but the vision tower takes "
                f"{theirs}={want} (config.json vision_config)"
            )
    return None


def tokenizer_problem(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str | None:
    """Why `tokenizer` cannot write the model's image token `token_id` (a text model's tokenizer, or one
    whose image pad has another id), or None: the id must be one of the tokenizer's added tokens."""
    if token_id in (getattr(tokenizer, "added_tokens_decoder", None) or {}):
        return None
    name = tokenizer.convert_ids_to_tokens(token_id) if 0 <= token_id < len(tokenizer) else None
    where = f"is {name!r} in this tokenizer" if name is not None else "is outside this tokenizer"
    return f"the model's image_token_id={token_id} {where}, not an image token (a text model's tokenizer?)"
