"""Rollout: the engines that sample responses, looked up by name (config `rollout.engine`).

`ENGINES` maps a name to a builder taking flat keyword arguments (`model_path`, `dtype`, `device`, ...) and
returning a `RolloutEngine` (see `ascent.rollout.base`). `sampling` holds the sampler every engine shares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ascent.models.action_head import ActionHeadSpec
from ascent.models.loading import load_tokenizer
from ascent.rollout.base import RolloutEngine
from ascent.rollout.reference import ReferenceEngine


def build_reference_engine(
    model_path: str | Path | None = None,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device = "auto",
    *,
    model: nn.Module | None = None,
    tokenizer_path: str | Path | None = None,
    eos_token_ids: Sequence[int] | None = None,
    pad_token_id: int | None = None,
    decode: Callable[[list[int]], str] | None = None,
    generation_batch_size: int = 64,
    trust_remote_code: bool = False,
    gpu_memory_fraction: float | None = None,
    action_head: ActionHeadSpec | None = None,
) -> ReferenceEngine:
    """A ReferenceEngine on `model` (shared as given) or on the checkpoint at `model_path`.

    EOS/pad ids and `decode` (for stop strings) come from the tokenizer at `tokenizer_path` (default
    `model_path`) unless given. `gpu_memory_fraction` belongs to the fast engine and is ignored here.
    `action_head`: the engine acts with a continuous action head (`ascent.rollout.action_sampler`); a
    shared `model` must carry it already.
    """
    del gpu_memory_fraction
    tok_dir = tokenizer_path or model_path
    if tok_dir is not None and (decode is None or eos_token_ids is None or pad_token_id is None):
        tokenizer = load_tokenizer(tok_dir, trust_remote_code=trust_remote_code)
        decode = decode or tokenizer.decode
        eos_token_ids = eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id]
        pad_token_id = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
    if model is not None:
        if eos_token_ids is None or pad_token_id is None:
            raise ValueError(
                "build_reference_engine(model=...): pass eos_token_ids and pad_token_id, or tokenizer_path."
            )
        return ReferenceEngine(
            model, eos_token_ids, pad_token_id, decode, generation_batch_size, action_head=action_head
        )
    if model_path is None:
        raise ValueError(
            "rollout.engine=reference needs model.path (or a model module) to load weights from."
        )
    return ReferenceEngine.from_pretrained(
        model_path,
        dtype,
        device,
        eos_token_ids=eos_token_ids,
        pad_token_id=pad_token_id,
        decode=decode,
        batch_size=generation_batch_size,
        trust_remote_code=trust_remote_code,
        action_head=action_head,
    )


def build_fast_engine(**kwargs: Any) -> RolloutEngine:
    """The GPU engine (`ascent.rollout.fast`), imported only when asked for: it may need triton."""
    # deferred: triton and CUDA, only when asked for
    from ascent.rollout.fast import build_fast_engine as build

    return build(**kwargs)


ENGINES: dict[str, Callable[..., RolloutEngine]] = {
    "reference": build_reference_engine,
    "fast": build_fast_engine,
}


def build_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Build the engine registered as `name` with flat keyword arguments (model_path, dtype, device, ...)."""
    if name not in ENGINES:
        raise ValueError(f"rollout.engine={name!r} is not a known engine; choose one of {sorted(ENGINES)}.")
    return ENGINES[name](**kwargs)


__all__ = ["ENGINES", "ReferenceEngine", "RolloutEngine", "build_engine", "build_reference_engine"]
