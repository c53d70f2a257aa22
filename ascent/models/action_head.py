"""A continuous action head: a small Gaussian policy over a language (or vision-language) model's last hidden
state, predicting an action chunk (design: "Every source is an environment": actions are sampled tokens or
continuous vectors from an action head, each with its log-probability; the action-head policy of "Model
families").

`ActionHead(hidden_size, action_dim, chunk)`: mean = Linear(H -> chunk * action_dim) of the hidden state of
the sequence's last token (the state in which the action is chosen, as a token's logprob is read from the
position before it), and one learnable log-std per action dimension (shared over the chunk), so

    log pi(a | s) = sum over chunk k and dimension d of
                    -((a_kd - mu_kd) / sigma_d)^2 / 2 - log sigma_d - log(2 pi) / 2,

one number per action chunk (`gaussian_logprob`): the PPO/GRPO ratio exp(new - old) of an action is that of a
one-token turn. The Gaussian is not squashed: a sampled action may leave the space's bounds and the simulator
clips it (a tanh squash would add its Jacobian to the log-probability; not done here). The head runs in fp32.

The sampler (`ascent.rollout.action_sampler`) and the trainer (`ascent.trainer.action_policy`) both read the
hidden state through `last_hidden_states` and score through `ActionHead.log_prob`, so they agree on the
log-probability of an action up to float rounding.

In the RL loop (`model.action_head`): `attach_action_head` hangs the head on the causal LM as its
`action_head` submodule, so its parameters are the policy's (`action_head.mean_proj.weight`, ...): the
optimizer steps them, the transport publishes them with the other weights, and `save_action_head` /
`attach_action_head` keep them beside the Hugging Face weights of a checkpoint (`action_head.safetensors`).
An action is one placeholder token (`ActionHeadSpec.token_id`) of the episode: loss mask 1, the chunk's
log-probability as its logprob, the hidden state before it the state the action was chosen in.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

LOG_2PI = math.log(2 * math.pi)


def gaussian_logprob(actions: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    """actions [B, K, D], mean [B, K, D], log_std [D] -> [B]: the diagonal Gaussian's log-density of each
    action chunk, summed over its K steps and D dimensions."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * LOG_2PI).sum(dim=(-2, -1))


def gaussian_entropy(log_std: Tensor, chunk: int) -> Tensor:
    """log_std [D], chunk K -> []: the entropy of one action chunk, K * sum_d (log sigma_d + (1 + log 2pi)/2)."""
    return chunk * (log_std + 0.5 * (1.0 + LOG_2PI)).sum()


class ActionHead(nn.Module):
    """hidden [B, H] -> a Gaussian over action chunks [B, chunk, action_dim] (module docstring)."""

    def __init__(self, hidden_size: int, action_dim: int, chunk: int = 1, init_log_std: float = 0.0) -> None:
        super().__init__()
        if action_dim < 1 or chunk < 1:
            raise ValueError(f"action_dim={action_dim}, chunk={chunk}: an action chunk needs both >= 1")
        self.action_dim, self.chunk = action_dim, chunk
        self.mean_proj = nn.Linear(hidden_size, chunk * action_dim)
        nn.init.zeros_(
            self.mean_proj.weight
        )  # every action starts at mean 0 (the bias), the std at exp(init)
        nn.init.zeros_(self.mean_proj.bias)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def mean(self, hidden: Tensor) -> Tensor:
        """hidden [B, H] -> mean [B, chunk, action_dim] (fp32)."""
        return self.mean_proj(hidden.float()).view(-1, self.chunk, self.action_dim)

    def log_prob(self, hidden: Tensor, actions: Tensor) -> Tensor:
        """hidden [B, H], actions [B, chunk, action_dim] -> log pi(actions | hidden) [B]."""
        return gaussian_logprob(actions.float(), self.mean(hidden), self.log_std)

    @torch.no_grad()
    def sample(self, hidden: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """hidden [B, H] -> (actions [B, chunk, action_dim], their log-probabilities [B]); a `generator`
        makes the draw reproducible."""
        mean = self.mean(hidden)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        actions = mean + noise * self.log_std.exp()
        return actions, gaussian_logprob(actions, mean, self.log_std)


def last_hidden_states(model: nn.Module, sequences: Sequence[Sequence[int]], **inputs: Any) -> Tensor:
    """A causal LM and token ids (one list per sequence) -> the final layer's hidden state at each
    sequence's last token [B, H]. Sequences are right-padded (positions count from 0 in every row, as in a
    lone forward); `inputs` go to the model as they are (a vision-language model's pixel values)."""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(s) for s in sequences], device=device)
    ids = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.long, device=device)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long, device=device)
    mask = (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False, **inputs)
    rows = torch.arange(len(sequences), device=device)
    return out.hidden_states[-1][rows, lengths - 1]


HEAD_FILE = "action_head.safetensors"  # a checkpoint's head, beside its Hugging Face weights
HEAD_NAME = "action_head"  # the head's submodule name on the causal LM (its parameters' name prefix)


@dataclass(frozen=True)
class ActionHeadSpec:
    """The head of a run (`model.action_head`): `dim` dimensions per step, `chunk` steps per action, the
    initial std, and the placeholder token id that stands for an action in an episode's tokens."""

    dim: int
    chunk: int = 1
    init_std: float = 1.0
    token_id: int = 0


def action_head_of(model: nn.Module) -> ActionHead | None:
    """The head `attach_action_head` hung on `model` (a PEFT or compile wrapper looked through), else None."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    inner = getattr(base, "_orig_mod", base)
    head = getattr(inner, HEAD_NAME, None)
    return head if isinstance(head, ActionHead) else None


def attach_action_head(
    model: nn.Module, spec: ActionHeadSpec, checkpoint: str | Path | None = None
) -> ActionHead:
    """A fresh head of `spec` on `model` (as `model.action_head`, fp32, on the model's device), loaded from
    `checkpoint`'s `action_head.safetensors` when there is one (a saved run), else initialised (mean 0, std
    `init_std`)."""
    config: Any = getattr(model, "config")  # noqa: B009 - a Hugging Face model's config, typed loosely
    hidden = int(config.get_text_config().hidden_size)
    head = ActionHead(hidden, spec.dim, spec.chunk, init_log_std=math.log(spec.init_std))
    saved = None if checkpoint is None else Path(checkpoint) / HEAD_FILE
    if saved is not None and saved.is_file():
        head.load_state_dict(load_file(str(saved)))
    head.to(next(model.parameters()).device)
    setattr(model, HEAD_NAME, head)
    return head


def save_action_head(model: nn.Module, directory: str | Path) -> None:
    """Write `model`'s head (if it has one) to `directory/action_head.safetensors`."""
    head = action_head_of(model)
    if head is not None:
        state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
        save_file(state, str(Path(directory) / HEAD_FILE))


@contextlib.contextmanager
def without_action_head(model: nn.Module) -> Iterator[None]:
    """`model` without its head for the duration (a Hugging Face save or load of the LM's own weights)."""
    head = getattr(model, HEAD_NAME, None)
    if head is not None:
        delattr(model, HEAD_NAME)
    try:
        yield
    finally:
        if head is not None:
            setattr(model, HEAD_NAME, head)
