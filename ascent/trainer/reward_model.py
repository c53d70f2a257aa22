"""`RewardModel`: a sequence-classification reward model that scores (prompt, response) texts, batched.

The sibling of the critic's `ValueModel`, frozen: a Hugging Face `*ForSequenceClassification` checkpoint
with one label (`num_labels=1`, e.g. Qwen2ForSequenceClassification), its own tokenizer. A text pair is
formatted as a user and an assistant message with the reward model's chat template (`chat_template=True`)
or as prompt + response text, tokenized, and the sequences packed back to back into rows of at most
`max_tokens_per_batch` tokens (`ascent.trainer.packing.plan_micro_batches`; positions restart per sequence,
so attention never crosses sequences, as in the trainer's packed forwards). The score of a sequence is the
classification head on the last token's hidden state (what transformers' own pooling reads on an unpadded
sequence). The worker group that holds it is `ascent.orchestrator.workers.RewardModelWorker`, built from a
`RewardModelSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ascent.errors import AscentError
from ascent.models.loading import compute_dtype, load_tokenizer, resolve_device
from ascent.models.varlen import attention_kwargs
from ascent.trainer.packing import plan_micro_batches


class RewardModelError(AscentError, ValueError):
    """A reward-model checkpoint that cannot score; the message names `reward.model.path` and the fix."""


@dataclass(frozen=True)
class RewardModelSpec:
    """What a reward-model worker is built from (setup's `reward_model_spec`)."""

    path: str
    device: str = "auto"
    dtype: str = "fp32"
    max_tokens_per_batch: int = 8192
    chat_template: bool = True
    trust_remote_code: bool = False


class RewardModel:
    """Loads the checkpoint of `spec` (eval mode, no gradients) and scores text pairs."""

    def __init__(self, spec: RewardModelSpec, device: torch.device | None = None) -> None:
        # deferred: transformers, slow to import
        from transformers import AutoModelForSequenceClassification

        self.spec = spec
        self.device = device or resolve_device(spec.device)
        self.tokenizer = load_tokenizer(spec.path, spec.trust_remote_code, "reward.model.path")
        if not Path(spec.path, "config.json").is_file():
            raise RewardModelError(
                f"reward.model.path={spec.path!r} has no config.json; point it at a checkpoint."
            )
        model: Any = AutoModelForSequenceClassification.from_pretrained(
            spec.path,
            dtype=compute_dtype(spec.dtype, self.device, "reward.model.dtype"),
            local_files_only=True,
            attn_implementation="sdpa",
            trust_remote_code=spec.trust_remote_code,
        )
        if model.config.num_labels != 1:
            raise RewardModelError(
                f"reward.model.path={spec.path!r}: the checkpoint has num_labels={model.config.num_labels}; a "
                "reward model has one scalar output (save it with num_labels=1)."
            )
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.backbone: nn.Module = getattr(model, model.base_model_prefix)
        self.head: nn.Module = model.score if hasattr(model, "score") else model.classifier

    def encode(self, prompt: str, response: str) -> list[int]:
        """One pair -> the reward model's token ids (its chat template, or the two texts joined)."""
        if self.spec.chat_template:
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        else:
            text = prompt + response
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return ids or [self.tokenizer.pad_token_id]

    @torch.no_grad()
    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """(prompt, response) pairs -> one score each, input order, in packed forwards."""
        sequences = [self.encode(p, r) for p, r in pairs]
        budget = max([self.spec.max_tokens_per_batch, *(len(s) for s in sequences)])
        scores = [0.0] * len(sequences)
        for batch in plan_micro_batches([len(s) for s in sequences], budget):
            values = self._forward([sequences[i] for i in batch])
            for i, value in zip(batch, values.tolist(), strict=True):
                scores[i] = float(value)
        return scores

    def _forward(self, sequences: list[list[int]]) -> Tensor:
        """Sequences packed into one row -> their scores [S] (fp32), read at each sequence's last token."""
        ids = torch.tensor([t for s in sequences for t in s], device=self.device).unsqueeze(0)
        positions = torch.tensor([p for s in sequences for p in range(len(s))], device=self.device)
        lengths = torch.tensor([len(s) for s in sequences], device=self.device)
        ends = torch.cumsum(lengths, 0) - 1
        cu = torch.cat([lengths.new_zeros(1), ends + 1]).to(torch.int32)
        out = self.backbone(
            input_ids=ids,
            position_ids=positions.unsqueeze(0),
            attention_mask=None,
            use_cache=False,
            **attention_kwargs(self.backbone, cu, max(len(s) for s in sequences)),
        )
        hidden = out.last_hidden_state[0].index_select(0, ends)  # [S, H]
        return self.head(hidden).float().squeeze(-1)
