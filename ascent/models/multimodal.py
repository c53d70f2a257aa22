"""A vision-language model's extra forward inputs, built the same way by the reference engine and the trainer.

A Qwen-VL model reads, beside the token ids, the images' patches (`pixel_values`, `image_grid_thw`), which
tokens are image tokens (`mm_token_type_ids`) and multimodal RoPE positions: three rows (time, height,
width) that coincide with the token index on text and follow the patch grid on an image's tokens, so a
sequence's positions depend on its images. Left to itself the model computes them (`get_rope_index`) for a
whole padded batch and keeps a `rope_deltas` state between calls; ascent instead asks `get_rope_index` for
each sequence on its own (`mrope_positions`, [3, L]) and passes the positions explicitly, so that the
engine's left-padded decode and the trainer's packed rows see exactly the positions a lone forward would.

`vision_inputs` gives the image keywords of one forward over a batch (images in row-major order: row by
row, each row's images in the order of their placeholder runs, which is how the model scatters them).
The trainer's packed rows take `packed_positions` ([4, 1, N]: text positions, restarting per sequence,
then each sequence's mrope rows, the layout transformers' Qwen-VL text models read as packed) and
`packed_inputs_embeds`: each distinct image through the vision tower once, its features scattered into the
token embeddings, so the language model runs on its own (`language_model`) and its attention keywords
(varlen offsets, `ascent.models.varlen`) never reach the tower, on any transformers version.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from ascent.errors import AscentError
from ascent.messages import ImageInput
from ascent.models.vision import model_inputs


class ImageCountError(AscentError, ValueError):
    """A sequence whose image-token runs and images disagree in number or size."""


class NoVisionTowerError(AscentError, ValueError):
    """A vision setting (`model.freeze_vision_tower`) for a model without a vision tower."""


def _language_model_holder(model: nn.Module) -> Any:
    """The transformers model under a peft wrapper, or the model itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def is_vision_language(model: nn.Module) -> bool:
    """Whether `model` (peft-wrapped too) takes images: its config has a vision part and an image token."""
    config = getattr(_language_model_holder(model), "config", None)
    return getattr(config, "vision_config", None) is not None and hasattr(config, "image_token_id")


def image_token_id(model: nn.Module) -> int:
    """The `<|image_pad|>` id of a vision-language model."""
    return int(_language_model_holder(model).config.image_token_id)


def multimodal_backbone(model: nn.Module) -> nn.Module:
    """The part of a vision-language model that maps ids and images to hidden states (vision tower, merger
    and language model; `Qwen2_5_VLModel`), i.e. the model without its LM head."""
    inner = getattr(_language_model_holder(model), "model", None)
    if inner is None or not hasattr(inner, "get_rope_index"):
        raise TypeError(f"{type(model).__name__}: expected a Qwen-VL model with .model.get_rope_index.")
    return cast(nn.Module, inner)


def image_runs(ids: Tensor, token_id: int) -> list[int]:
    """ids [L] -> the length of each run of `token_id`, in order."""
    is_image = (ids == token_id).long()
    starts = torch.nonzero(torch.diff(is_image, prepend=is_image.new_zeros(1)) == 1).flatten().tolist()
    ends = torch.nonzero(torch.diff(is_image, append=is_image.new_zeros(1)) == -1).flatten().tolist()
    return [e + 1 - s for s, e in zip(starts, ends, strict=True)]


def check_images(ids: Tensor, images: Sequence[ImageInput], token_id: int, what: str = "sequence") -> None:
    """Raise ImageCountError unless `ids` [L] holds one run of image tokens per image, of its num_tokens."""
    runs = image_runs(ids, token_id)
    want = [im.num_tokens for im in images]
    if runs != want:
        raise ImageCountError(
            f"{what}: its token ids hold image-token runs of lengths {runs}, its images need {want}; expand "
            "each image's <|image_pad|> to its num_tokens (ascent.models.vision.ImageCodec.expand)."
        )


def mrope_positions(model: nn.Module, ids: Tensor, images: Sequence[ImageInput]) -> Tensor:
    """ids [L] of ONE sequence with its images -> multimodal RoPE positions [3, L] (long, on ids' device),
    as the model's own `get_rope_index` computes them; text-only: arange(L) on each row."""
    if not images:
        return torch.arange(ids.shape[0], device=ids.device).expand(3, -1)
    token_id = image_token_id(model)
    check_images(ids, images, token_id)
    grid = torch.tensor([im.grid_thw for im in images], dtype=torch.long, device=ids.device)
    row = ids[None]
    positions, _ = cast(Any, multimodal_backbone(model)).get_rope_index(
        row, mm_token_type_ids=(row == token_id).int(), image_grid_thw=grid
    )
    return positions[:, 0]


def vision_inputs(
    model: nn.Module, input_ids: Tensor, images: Sequence[ImageInput], device: torch.device
) -> dict[str, Tensor]:
    """input_ids [b, L] and ALL its images in row-major order -> the forward's image keywords
    (`pixel_values` [patches, D], `image_grid_thw` [n, 3], `mm_token_type_ids` [b, L]); {} without images."""
    if not images:
        return {}
    out = {k: v.to(device) for k, v in model_inputs(images).items()}
    out["mm_token_type_ids"] = (input_ids == image_token_id(model)).int()
    return out


def packed_positions(
    model: nn.Module, input_ids: Tensor, cu_seqlens: Sequence[int], seq_images: Sequence[Sequence[ImageInput]]
) -> Tensor:
    """One packed row of S sequences -> position_ids [4, 1, N]: row 0 the text positions (restarting at 0
    per sequence, from which transformers builds the block-causal mask), rows 1-3 each sequence's own
    multimodal RoPE positions (`mrope_positions`). input_ids [1, N]; cu_seqlens: S + 1 offsets."""
    ids = input_ids[0]
    text, mrope = [], []
    for k, images in enumerate(seq_images):
        piece = ids[cu_seqlens[k] : cu_seqlens[k + 1]]
        text.append(torch.arange(piece.shape[0], device=ids.device))
        mrope.append(mrope_positions(model, piece, images))
    return torch.cat([torch.cat(text)[None], torch.cat(mrope, dim=1)])[:, None]


def language_model(model: nn.Module) -> nn.Module:
    """The language model of a vision-language model (the decoder stack its backbone runs after the tower)."""
    return cast(nn.Module, multimodal_backbone(model).language_model)


def _distinct(images: Sequence[ImageInput]) -> tuple[list[ImageInput], list[int]]:
    """images -> (the distinct ones (same digest and grid), which[i]: images[i] is distinct[which[i]])."""
    index: dict[tuple[str, tuple[int, int, int]], int] = {}
    distinct: list[ImageInput] = []
    which: list[int] = []
    for im in images:
        key = (im.digest, im.grid_thw)
        if key not in index:
            index[key] = len(distinct)
            distinct.append(im)
        which.append(index[key])
    return distinct, which


def encode_images(
    backbone: nn.Module, images: Sequence[ImageInput], device: torch.device
) -> tuple[Tensor, list[Tensor] | None]:
    """images (row-major order) -> (features [T, H] of all their image tokens in that order, Qwen3-VL's
    deepstack features (one [T, H] per deepstack layer) or None).

    Each distinct image goes through the tower once: a group's samples share their prompt's images, so the
    same rows are indexed out for each occurrence and gradients from every sample add up on one pass."""
    distinct, which = _distinct(images)
    inputs = model_inputs(distinct)
    out = cast(Any, backbone).get_image_features(
        inputs["pixel_values"].to(device), inputs["image_grid_thw"].to(device), return_dict=True
    )
    per_image = list(out.pooler_output)
    features = torch.cat([per_image[j] for j in which])
    deep = getattr(out, "deepstack_features", None)
    if not deep:
        return features, None
    sizes = [p.shape[0] for p in per_image]
    stacked = []
    for layer in deep:  # per image (a tuple) or all images' tokens in one tensor, by transformers version
        parts = list(layer) if isinstance(layer, (tuple, list)) else list(layer.split(sizes))
        stacked.append(torch.cat([parts[j] for j in which]))
    return features, stacked


def packed_inputs_embeds(
    model: nn.Module, input_ids: Tensor, images: Sequence[ImageInput]
) -> tuple[Tensor, dict[str, Any]]:
    """input_ids [1, N] holding `images` (row-major) -> (inputs_embeds [1, N, H] with the image features in
    place of the image tokens, the language model's extra keywords: Qwen3-VL's deepstack inputs, else {})."""
    backbone = multimodal_backbone(model)
    embeds = cast(Any, backbone).get_input_embeddings()(input_ids)
    if not images:
        return embeds, {}
    features, deepstack = encode_images(backbone, images, input_ids.device)
    is_image = input_ids == image_token_id(model)
    embeds = embeds.masked_scatter(is_image.unsqueeze(-1).expand_as(embeds), features.to(embeds.dtype))
    if deepstack is None:
        return embeds, {}
    return embeds, {"visual_pos_masks": is_image, "deepstack_visual_embeds": deepstack}


def image_features(
    backbone: nn.Module, input_ids: Tensor, images: Sequence[ImageInput], device: torch.device
) -> dict[str, Any]:
    """The image keywords of a backbone forward over input_ids [b, L] holding `images` (row-major order);
    {} without images. The vision tower runs on its own, so the language model's attention keywords never
    reach it.

    Where the backbone takes precomputed features (`mm_encoder_outputs`, transformers >= 5.2x), each
    distinct image (same digest and grid) goes through the tower once: a group's samples share their
    prompt's images, and their embeddings (Qwen3-VL: and deepstack features) are the same tensors reused,
    so gradients from every sample add up on one tower pass. Older transformers get the raw pixels of every
    image (`vision_inputs`) and encode each occurrence."""
    if not images:
        return {}
    if "mm_encoder_outputs" not in inspect.signature(backbone.forward).parameters:
        return vision_inputs(backbone, input_ids, images, device)
    distinct, which = _distinct(images)
    inputs = model_inputs(distinct)
    features = cast(Any, backbone).get_image_features(
        inputs["pixel_values"].to(device), inputs["image_grid_thw"].to(device), return_dict=True
    )
    if len(distinct) < len(images):
        features.pooler_output = tuple(features.pooler_output[j] for j in which)
        if getattr(features, "deepstack_features", None) is not None:
            features.deepstack_features = [tuple(f[j] for j in which) for f in features.deepstack_features]
    return {"mm_encoder_outputs": {"image": features}}


def vision_tower(model: nn.Module) -> nn.Module:
    """The vision tower of a vision-language model (`model.model.visual`: patch embedding, blocks, merger)."""
    return cast(nn.Module, multimodal_backbone(model).visual)


def freeze_vision(model: nn.Module) -> int:
    """Stop the vision tower (and its merger) of a vision-language model from training: requires_grad off,
    so the optimizer never holds its weights. -> the number of parameters frozen; raises for a text model."""
    if not is_vision_language(model):
        raise NoVisionTowerError(
            f"model.freeze_vision_tower=true: {type(model).__name__} has no vision tower; set it to false "
            "for a text-only model."
        )
    params = list(vision_tower(model).parameters())
    for p in params:
        p.requires_grad_(False)
    return sum(p.numel() for p in params)
