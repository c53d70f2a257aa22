"""The reference engine's action step for an action-head policy (`ascent.models.action_head`): one forward
of the model over each observation's token ids, the head's Gaussian sampled at the last token, the action
chunk returned with its log-probability (design: actions are "continuous vectors from an action head, each
with its log-probability").

Only here, beside the reference engine: the fast engine has no hidden-state output yet, and the runner and
the loop do not carry action vectors through episodes yet (an environment receives text). A caller plays an
episode by `act` on the conversation's ids each turn, steps its simulator with the actions, and trains with
`ascent.trainer.action_policy` on the returned log-probabilities as the old ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ascent.models.action_head import ActionHead, last_hidden_states


@dataclass(frozen=True)
class ActionSample:
    """One sampled action chunk: `actions` [chunk][action_dim] and its log-probability under the sampler."""

    actions: list[list[float]]
    logprob: float


class ActionSampler:
    """A model and its action head, sampling action chunks for token-id observations (module docstring)."""

    def __init__(self, model: nn.Module, head: ActionHead, seed: int | None = None) -> None:
        self.model, self.head = model, head
        device = next(model.parameters()).device
        self.generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)

    @torch.no_grad()
    def act(self, sequences: Sequence[Sequence[int]], **inputs: Any) -> list[ActionSample]:
        """One action chunk per sequence of token ids (the observation so far), with its log-probability."""
        hidden = last_hidden_states(self.model, sequences, **inputs)
        actions, logprobs = self.head.sample(hidden, self.generator)
        return [
            ActionSample(actions=a.tolist(), logprob=float(lp))
            for a, lp in zip(actions.cpu(), logprobs.cpu(), strict=True)
        ]
