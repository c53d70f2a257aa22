"""Images in the fast engine: the vision tower at prefill and multimodal RoPE (Qwen2.5-VL, Qwen3-VL).

A vision-language checkpoint's language model runs in our decoder (runner.py); its vision tower is
transformers' own module, loaded from the same state dict (`build_vision`). At admission (batching.py) every
prompt with images gets, from `VisionTower.rows`:
- its multimodal RoPE positions ([3, L]: time, height, width rows), computed by the model class's own
  `get_rope_index` on the whole prompt (a continuation's cached prefix included, so its new tokens sit where
  a lone forward puts them); the prefill rotates each token by them (`mrope_cos_sin`), and its decode steps
  by their token index plus the row's `rope_delta` (largest position + 1 - prompt length, transformers'
  `rope_deltas`: on text tokens the three rows are equal, so the plain tables serve);
- the embeddings of the images whose tokens it prefills (those of a cached session prefix have their K/V
  already): each distinct image (digest and grid) of the whole prefill batch goes through the tower once, so
  the n samples of a group (one prefill) and the turns of a session share one encoding. They replace the
  image tokens' embeddings; Qwen3-VL's deepstack features are added to those tokens' hidden states after
  the first decoder layers, as transformers does.
Decode steps are text only and unchanged (CUDA graphs included): the row's `rope_delta` is a tensor they read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ascent.messages import ImageInput
from ascent.models.families import ModelSpec
from ascent.models.vision import model_inputs
from ascent.rollout.fast.sequence import image_spans

VISUAL = "model.visual."  # the engine's names of the tower's weights (ascent.models.families.qwen_vl)


def is_vision_config(config: Any) -> bool:
    """Whether a transformers config describes a vision-language model (a vision part and an image token)."""
    return getattr(config, "vision_config", None) is not None and hasattr(config, "image_token_id")


def mrope_rows(spec: ModelSpec) -> Tensor:
    """-> [head_dim] long: the position row (0 time, 1 height, 2 width) each rotary dimension reads.

    Blocks of `mrope_section` (Qwen2.5-VL's `apply_multimodal_rotary_pos_emb`) or, interleaved (Qwen3-VL),
    height on dimensions 1, 4, 7, ... and width on 2, 5, 8, ... up to 3 * their section, time elsewhere."""
    half = spec.head_dim // 2
    if spec.mrope_interleaved:
        rows = torch.zeros(half, dtype=torch.long)
        for r in (1, 2):
            rows[r : 3 * spec.mrope_section[r] : 3] = r
    else:
        rows = torch.cat([torch.full((s,), i, dtype=torch.long) for i, s in enumerate(spec.mrope_section)])
    return torch.cat([rows, rows])


def mrope_cos_sin(cos: Tensor, sin: Tensor, positions: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Tables cos/sin [max_len, d], positions [3, T], rows [d] (`mrope_rows`) -> cos, sin [T, d]: dimension
    j of token t from the table at positions[rows[j], t] (the same values transformers computes)."""
    idx = positions[rows].T  # [T, d]
    col = torch.arange(cos.shape[1], device=cos.device)[None, :]
    return cos[idx, col], sin[idx, col]


@dataclass
class RowImages:
    """One prefill row's multimodal inputs, for the suffix it prefills: positions [3, S] (long), the suffix
    offsets of its image tokens [N], their embeddings [N, H] (fp32) and deepstack features (one [N, H] per
    layer they join)."""

    positions: Tensor
    offsets: Tensor
    embeds: Tensor
    deepstack: tuple[Tensor, ...]


def _key(im: ImageInput) -> tuple[str, tuple[int, int, int]]:
    return im.digest, im.grid_thw


class VisionTower:
    """The tower module, the model class's `get_rope_index` (on a weightless backbone) and the image token;
    `stats["images"]` counts images encoded, `stats["passes"]` tower forward passes."""

    def __init__(self, module: nn.Module, backbone: Any, image_token_id: int, hidden_size: int):
        self.module, self.backbone = module, backbone
        self.image_token_id, self.hidden_size = image_token_id, hidden_size
        self.stats = {"images": 0, "passes": 0}

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def positions(self, ids: Sequence[int], images: Sequence[ImageInput]) -> Tensor:
        """A prompt's multimodal RoPE positions [3, L] (CPU), from the model's own `get_rope_index`."""
        row = torch.tensor([list(ids)], dtype=torch.long)
        grid = torch.tensor([im.grid_thw for im in images], dtype=torch.long)
        mm = (row == self.image_token_id).int()
        positions, _ = self.backbone.get_rope_index(row, mm_token_type_ids=mm, image_grid_thw=grid)
        return positions[:, 0]

    @torch.no_grad()
    def encode(self, images: Sequence[ImageInput]) -> dict[tuple, tuple[Tensor, tuple[Tensor, ...]]]:
        """Distinct images -> {(digest, grid): (embeddings [num_tokens, H] fp32, deepstack features)}, in
        one tower pass (what transformers' `get_image_features` computes)."""
        if not images:
            return {}
        inputs = model_inputs(images)
        dt = next(self.module.parameters()).dtype
        out = self.module(
            inputs["pixel_values"].to(self.device, dt), grid_thw=inputs["image_grid_thw"].to(self.device)
        )
        sizes = [im.num_tokens for im in images]
        embeds = out.pooler_output.float().split(sizes)
        deep = [f.float().split(sizes) for f in (getattr(out, "deepstack_features", None) or [])]
        self.stats["images"] += len(images)
        self.stats["passes"] += 1
        return {_key(im): (embeds[i], tuple(f[i] for f in deep)) for i, im in enumerate(images)}

    def rows(
        self, prompts: Sequence[tuple[list[int], tuple[ImageInput, ...]]], starts: Sequence[int]
    ) -> tuple[list[RowImages | None], list[int]]:
        """Prompts (ids, images) prefilled from starts[i] -> (their RowImages, None for text prompts, and
        their rope deltas). The images of every suffix go through the tower together, each distinct once;
        an image sits wholly in the cached prefix or wholly in the suffix (the session store keeps it so)."""
        plan: list[tuple[Tensor, list[tuple[int, int, ImageInput]]] | None] = []
        deltas: list[int] = []
        todo: dict[tuple, ImageInput] = {}
        for (ids, images), start in zip(prompts, starts, strict=True):
            if not images:
                plan.append(None)
                deltas.append(0)
                continue
            pos = self.positions(ids, images)
            deltas.append(int(pos.max()) + 1 - len(ids))
            spans = [
                (s, e, im) for (s, e), im in zip(image_spans(ids, self.image_token_id), images, strict=True)
            ]
            fresh = [(s, e, im) for s, e, im in spans if s >= start]
            for _, _, im in fresh:
                todo.setdefault(_key(im), im)
            plan.append((pos[:, start:], [(s - start, e - start, im) for s, e, im in fresh]))
        features = self.encode(list(todo.values()))
        return [self._row(p, features) if p is not None else None for p in plan], deltas

    def _row(self, plan: tuple[Tensor, list[tuple[int, int, ImageInput]]], features: Mapping) -> RowImages:
        pos, spans = plan
        dev = self.device
        offsets = [torch.arange(s, e) for s, e, _ in spans]
        feats = [features[_key(im)] for _, _, im in spans]
        if not feats:
            empty = torch.zeros(0, self.hidden_size, device=dev)
            return RowImages(pos.to(dev), torch.zeros(0, dtype=torch.long, device=dev), empty, ())
        deep = tuple(torch.cat([f[1][k] for f in feats]) for k in range(len(feats[0][1])))
        return RowImages(pos.to(dev), torch.cat(offsets).to(dev), torch.cat([f[0] for f in feats]), deep)

    def allowed(self, vocab_size: int, config: Any) -> Tensor:
        """[V] bool: every token but the image and video pads (never sampled: a sampled pad would stand for
        an image that does not exist, as the reference engine also rules out)."""
        out = torch.ones(vocab_size, dtype=torch.bool, device=self.device)
        for name in ("image_token_id", "video_token_id"):
            token = getattr(config, name, None)
            if isinstance(token, int) and token < vocab_size:
                out[token] = False
        return out


def assemble(
    rows: Sequence[RowImages | None], starts: Sequence[int], lq: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """A prefill batch's rows (padded to lq tokens) -> positions [3, b * lq] (text rows and padding: their
    token index), flat indices of image tokens [N], their embeddings [N, H], deepstack features per layer."""
    b = len(rows)
    base = torch.tensor(list(starts), device=device)[:, None] + torch.arange(lq, device=device)[None, :]
    positions = base[None].expand(3, b, lq).clone()
    index, embeds, deep = [], [], []
    for i, r in enumerate(rows):
        if r is None:
            continue
        positions[:, i, : r.positions.shape[1]] = r.positions
        index.append(r.offsets + i * lq)
        embeds.append(r.embeds)
        deep.append(r.deepstack)
    width = max((len(d) for d in deep), default=0)
    deepstack = [torch.cat([d[k] for d in deep if len(d) > k]) for k in range(width)]
    return positions.reshape(3, b * lq), torch.cat(index), torch.cat(embeds), deepstack


def build_vision(
    config: Any, sd: Mapping[str, Tensor], dtype: torch.dtype, device: torch.device, share: bool
) -> tuple[VisionTower, dict[str, Tensor]]:
    """The tower of a vision-language config with the `model.visual.*` tensors of `sd` (engine names):
    shared as they are (`share`) or copied in `dtype` on `device` -> (VisionTower, engine name -> tensor the
    weight updates write)."""
    from transformers import AutoModel  # deferred: transformers, slow to import

    with torch.device("meta"):  # the backbone class, for its get_rope_index: no weights
        backbone = AutoModel.from_config(config)
    tower_sd = {n[len(VISUAL) :]: t for n, t in sd.items() if n.startswith(VISUAL)}
    with torch.device(device):
        module = type(backbone.visual)._from_config(
            config.vision_config, attn_implementation="sdpa", dtype=dtype
        )
    module.load_state_dict(tower_sd, strict=True, assign=share)
    module.eval().requires_grad_(False)
    targets = {VISUAL + n: t for n, t in (tower_sd if share else module.state_dict()).items()}
    text = getattr(config, "text_config", None) or config
    return VisionTower(module, backbone, int(config.image_token_id), int(text.hidden_size)), targets
