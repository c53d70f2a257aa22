"""The policy update (design: "trainer/"): packing, chunked logprobs/entropy, optimizer, checkpoints, LoRA.

`PolicyWorker` and `CriticWorker` (the value model of PPO with GAE) are the workers the controller calls;
the modules below them are plain functions that take flat arguments and can be tested alone.
"""

from ascent.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ascent.trainer.critic import CriticWorker
from ascent.trainer.logprobs import token_logprobs
from ascent.trainer.loss import LossSettings, minibatch_totals
from ascent.trainer.packing import PackedBatch, pack, plan_micro_batches
from ascent.trainer.policy import PolicyWorker, TrainerOutOfMemory
from ascent.trainer.settings import LoraSettings, OptimSettings

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
