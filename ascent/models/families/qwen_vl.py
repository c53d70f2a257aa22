"""What the Qwen vision-language families (Qwen2.5-VL, Qwen3-VL) share: one `Family` shape.

The trainer loads them with `AutoModelForImageTextToText` (vision tower, merger and language model in one
module); the tokenizer is the checkpoint's own and images go through its image processor
(`AutoImageProcessor`, read by `ascent.models.vision.load_image_codec`; ascent expands image pads itself,
so the combined `AutoProcessor` and its video processor, which needs torchvision, are never loaded).
Only the reference engine runs them (`engine=None`): the fast engine has no vision tower or mrope yet.
Checkpoint names are the names the reference engine's model holds, so no mapping is needed.
"""

from __future__ import annotations

from ascent.models.families.family import Family


def qwen_vl(name: str) -> Family:
    """A Qwen-VL family: image-text-to-text class, image processor, reference engine only, same names."""
    return Family(
        name=name,
        model_types=(name,),
        trainer_class="AutoModelForImageTextToText",
        processor_class="AutoImageProcessor",
        engine=None,
    )
