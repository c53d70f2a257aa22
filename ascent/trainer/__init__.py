"""The policy update (design: "trainer/"): packing, chunked logprobs/entropy, optimizer, checkpoints, LoRA.

`PolicyWorker` and `CriticWorker` (the value model of PPO with GAE) are the workers the controller calls;
the modules below them are plain functions that take flat arguments and can be tested alone.

The names below are imported on first use (`__getattr__`), so a light submodule such as `checkpoint_commit`
(which the controller's run checkpoints use) can be imported without loading the trainer and FSDP.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ascent.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from ascent.trainer.critic import CriticWorker
    from ascent.trainer.logprobs import token_logprobs
    from ascent.trainer.loss import LossSettings, minibatch_totals
    from ascent.trainer.packing import PackedBatch, pack, plan_micro_batches
    from ascent.trainer.policy import PolicyWorker, TrainerOutOfMemory
    from ascent.trainer.settings import LoraSettings, OptimSettings

_HOMES = {
    "checkpoint": ["latest_checkpoint", "load_checkpoint", "save_checkpoint"],
    "critic": ["CriticWorker"],
    "logprobs": ["token_logprobs"],
    "loss": ["LossSettings", "minibatch_totals"],
    "packing": ["PackedBatch", "pack", "plan_micro_batches"],
    "policy": ["PolicyWorker", "TrainerOutOfMemory"],
    "settings": ["LoraSettings", "OptimSettings"],
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'ascent.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ascent.trainer.{_HOME[name]}"), name)
    globals()[name] = value  # the next access finds it directly
    return value


__all__ = [
    "CriticWorker",
    "LoraSettings",
    "LossSettings",
    "OptimSettings",
    "PackedBatch",
    "PolicyWorker",
    "TrainerOutOfMemory",
    "latest_checkpoint",
    "load_checkpoint",
    "minibatch_totals",
    "pack",
    "plan_micro_batches",
    "save_checkpoint",
    "token_logprobs",
]
