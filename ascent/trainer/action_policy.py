"""The trainer's side of an action-head policy (`ascent.models.action_head`): the log-probability of sampled
action chunks under the current weights, and the policy loss of PPO/GRPO over them.

An action chunk is scored like a one-token turn: `action_logprobs` recomputes log pi(a | s) from the same
hidden state the sampler read (`last_hidden_states`, the observation's last token), and `action_policy_loss`
feeds it, with the sampler's log-probabilities as the old ones and one advantage per action (GRPO's episode
advantage, or GAE's at the action's step), to a policy loss of `ascent.algorithms.POLICY_LOSSES` ([N]
tensors, one entry per action). Gradients reach the head's mean, its log-std and the model under it.

These are the standalone pieces (a caller's own loop, tests). The RL loop scores actions inside its packed
micro-batches instead (`ascent.trainer.logprobs.with_action_logprobs`: each action a placeholder token whose
row the head scores), so the run's own policy loss, aggregation and metrics apply to actions unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ascent.algorithms.policy_losses import ppo_loss
from ascent.models.action_head import ActionHead, last_hidden_states


def action_logprobs(
    model: nn.Module, head: ActionHead, sequences: Sequence[Sequence[int]], actions: Tensor, **inputs: Any
) -> Tensor:
    """sequences (token ids of N observations), actions [N, chunk, action_dim] -> log pi(actions) [N], with
    gradients."""
    return head.log_prob(last_hidden_states(model, sequences, **inputs), actions)


def action_policy_loss(
    model: nn.Module,
    head: ActionHead,
    sequences: Sequence[Sequence[int]],
    actions: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_ratio: float = 0.2,
) -> tuple[Tensor, dict[str, Tensor]]:
    """actions [N, chunk, action_dim], old_logprobs [N] (the sampler's), advantages [N] -> (the mean clipped
    PPO loss over the N actions [], its metrics)."""
    logprobs = action_logprobs(model, head, sequences, actions)
    n = logprobs.shape[0]
    loss, metrics = ppo_loss(
        logprobs,
        old_logprobs.to(logprobs),
        advantages.to(logprobs),
        torch.ones(n, device=logprobs.device),
        torch.arange(n, device=logprobs.device),
        clip_ratio_low=clip_ratio,
        clip_ratio_high=clip_ratio,
    )
    return loss.mean(), metrics
