"""The reference engine's action step for an action-head policy (`ascent.models.action_head`): one forward
of the model over each observation's token ids, the head's Gaussian sampled at the last token, the action
chunk returned with its log-probability (design: actions are "continuous vectors from an action head, each
with its log-probability").

The fast engine's counterpart is `ascent.rollout.fast.action` (same noise convention). In the loop
(`model.action_head`) the reference engine answers every request with `generations`: one placeholder token
(`ActionHeadSpec.token_id`) whose logprob is the chunk's log-probability, the chunk itself in
`Generation.action`; the runner steps the environment with the chunk (`ascent.envs.runner`). A seeded
request draws its noise from its own generator (the seed of the runner's turn), so a seeded run repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ascent.messages import Generation, GenerationRequest
from ascent.models.action_head import ActionHead, gaussian_logprob, last_hidden_states


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


@torch.no_grad()
def generations(
    model: nn.Module, head: ActionHead, requests: Sequence[GenerationRequest], token_id: int
) -> list[list[Generation]]:
    """One action per request (its `params.n` is taken as 1: the runner asks one turn at a time): the
    placeholder token `token_id` with the chunk's log-probability, and the chunk [chunk][action_dim] in
    `Generation.action`. A request with `params.seed` draws its noise from a generator of that seed."""
    hidden = last_hidden_states(model, [r.prompt_ids for r in requests])
    mean = head.mean(hidden)
    out = []
    for i, req in enumerate(requests):
        gen = None
        if req.params.seed is not None:
            gen = torch.Generator(device=mean.device).manual_seed(int(req.params.seed))
        noise = torch.randn(mean[i].shape, generator=gen, device=mean.device, dtype=mean.dtype)
        action = mean[i] + noise * head.log_std.exp()
        logprob = float(gaussian_logprob(action[None], mean[i][None], head.log_std)[0])
        out.append([Generation([token_id], [logprob], "stop", action=action.cpu().tolist())])
    return out
