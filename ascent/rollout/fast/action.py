"""The fast engine's continuous action head (`model.action_head`, `ascent.models.action_head`).

With a head, every request is one action turn, as on the reference engine (`ascent.rollout.action_sampler`):
the prompt is prefilled (never fed through decode steps), the head reads the final-norm hidden state of the
last prompt token, samples an action chunk and the turn is the placeholder token (`ActionHeadSpec.token_id`)
with the chunk's log-probability as its logprob, the chunk in `Generation.action`. A turn ends after that one
token ("stop"); its token enters the KV cache like any other, so a session's next turn reuses it. Noise
follows the reference engine's convention: a seeded request draws from `torch.Generator().manual_seed(seed)`
(its first sample; a later sample of n > 1 from its split seed), an unseeded one from the sample's own
fresh seed. The head is loaded from the checkpoint's `action_head.safetensors` (or shared with a given
module that carries one); publications' `action_head.*` tensors go to it, not to the decoder's weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from ascent.models.action_head import (
    HEAD_FILE,
    HEAD_NAME,
    ActionHead,
    ActionHeadSpec,
    action_head_of,
    gaussian_logprob,
)

PREFIX = HEAD_NAME + "."  # a published head tensor's name prefix (`action_head.mean_proj.weight`, ...)


def load_action_head(
    spec: ActionHeadSpec,
    hidden_size: int,
    device: torch.device,
    model_path: str | Path | None = None,
    model: nn.Module | None = None,
) -> ActionHead:
    """The head of a given `model` when it carries one (shared), else a fresh fp32 head of `spec` on `device`,
    loaded from `model_path`'s `action_head.safetensors` when there is one (as `attach_action_head`)."""
    shared = action_head_of(model) if model is not None else None
    if shared is not None:
        return shared
    head = ActionHead(hidden_size, spec.dim, spec.chunk, init_log_std=math.log(spec.init_std))
    saved = None if model_path is None else Path(model_path) / HEAD_FILE
    if saved is not None and saved.is_file():
        head.load_state_dict(load_file(str(saved)))
    return head.to(device)


def without_head_tensors(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """A module's state dict less its head's tensors (the decoder's weights only)."""
    return {n: t for n, t in sd.items() if not n.startswith(PREFIX)}


class ActionStep:
    """The head of a fast engine and its placeholder token: hidden states -> one action turn per sample."""

    def __init__(self, head: ActionHead, token_id: int) -> None:
        self.head, self.token_id = head, int(token_id)

    @torch.no_grad()
    def act(self, hidden: Tensor, seeds: list[int]) -> list[tuple[int, float, list[list[float]]]]:
        """hidden [B, H] (final-norm states of the last prompt tokens), one seed per row -> (placeholder
        token, the chunk's log-probability, the chunk [chunk][action_dim]) per row."""
        mean = self.head.mean(hidden)
        std = self.head.log_std.exp()
        out = []
        for i, seed in enumerate(seeds):
            gen = torch.Generator(device=mean.device).manual_seed(int(seed))
            noise = torch.randn(mean[i].shape, generator=gen, device=mean.device, dtype=mean.dtype)
            action = mean[i] + noise * std
            logprob = float(gaussian_logprob(action[None], mean[i][None], self.head.log_std)[0])
            out.append((self.token_id, logprob, action.cpu().tolist()))
        return out

    def take(self, named_tensors: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """Copy the published `action_head.*` tensors into the head; yield every other (decoder) tensor."""
        params = dict(self.head.state_dict(keep_vars=True))
        for name, tensor in named_tensors:
            if not name.startswith(PREFIX):
                yield name, tensor
                continue
            key = name[len(PREFIX) :]
            if key not in params:
                raise KeyError(f"update_weights: the action head has no parameter named {name!r}")
            with torch.no_grad():
                params[key].copy_(torch.as_tensor(tensor).to(params[key].device, params[key].dtype))
