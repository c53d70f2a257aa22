"""Mixture-of-experts routing in transformers models: find the routers, record what they chose, replay it.

Routing replay (R3, "rollout routing replay"): an MoE layer sends each token to the top-k experts of its
router's probabilities. The rollout engine and the trainer compute those probabilities with different
kernels, dtypes and batch shapes, so near-tied experts flip between them, and a token that went to other
experts in the trainer than in the sampler gets a logprob from a different function: the sampler/trainer
logprob gap of an MoE model is far wider than a dense model's. The engine therefore records the experts it
chose for every token and MoE layer (`RoutingRecorder`: int16 ids [tokens, layers, k]); they travel with
the sample (`Generation` -> `Episode` -> `TrainSample`, `routed_experts`), and the trainer's forward uses
them instead of its own top-k (`RoutingReplay`). The weights of the chosen experts are still the trainer's:
softmax of its own router logits at the replayed ids (renormalised as the router does), so the router keeps
its gradient. A token without recorded experts (id -1: the last sampled token, which no forward of the
engine consumed) is routed by the trainer itself.

transformers (>= 5) gives every MoE family a router module (`Qwen3MoeTopKRouter`, `MixtralTopKRouter`,
`Qwen2MoeTopKRouter`, ...) that maps hidden states [tokens, H] to (logits, weights, ids [tokens, k]); both
classes here hook those modules, so any such family works in the trainer and the reference engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

ROUTES_DTYPE = torch.int16  # expert ids of recorded routes: compact, 2 bytes per (token, layer, slot)
NOT_RECORDED = -1  # a token whose experts the engine did not record: the trainer routes it itself


def routers(model: nn.Module) -> list[nn.Module]:
    """The MoE routers of `model` in layer order (modules of a `*TopKRouter` class with a `top_k`)."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k")]


def is_moe(model: nn.Module) -> bool:
    """Whether `model` routes tokens to experts (it has at least one router)."""
    return bool(routers(model))


def replay_weights(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """logits [T, E], ids [T, k] -> the weights of experts `ids` as `router` computes them for its own top-k:
    softmax in fp32 gathered at the ids, renormalised unless the router says `norm_topk_prob=False`, cast
    to the logits' dtype when the router does (Qwen-MoE; Mixtral keeps fp32)."""
    probs = torch.softmax(logits.float(), dim=-1)
    top = probs.gather(-1, ids)
    if getattr(router, "norm_topk_prob", True):
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype) if hasattr(router, "norm_topk_prob") else top


class RoutingRecorder:
    """Records the experts every router of `model` chose in each forward run inside `with recorder:`.

    After a forward, `take()` -> ids [tokens, layers, k] (ROUTES_DTYPE, on the model's device) of that
    forward's tokens, in the order the model flattened them (batch row by row)."""

    def __init__(self, model: nn.Module):
        self.routers = routers(model)
        self._ids: list[Tensor | None] = [None] * len(self.routers)
        self._handles: list[Any] = []

    def __enter__(self) -> RoutingRecorder:
        for layer, router in enumerate(self.routers):
            self._handles.append(router.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, layer: int):
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            self._ids[layer] = output[2].detach().to(ROUTES_DTYPE)

        return hook

    def take(self) -> Tensor:
        """ids [tokens, layers, k] of the last forward (every router must have run)."""
        if any(t is None for t in self._ids):
            raise RuntimeError("RoutingRecorder.take: a router did not run in the last forward.")
        out = torch.stack([t for t in self._ids if t is not None], dim=1)
        self._ids = [None] * len(self.routers)
        return out


class RoutingReplay:
    """Makes the routers of `model` use recorded experts while `replaying(routes)` is active.

    The hooks stay installed for the model's life and do nothing outside `replaying`; keep the context open
    over the backward pass too, since activation checkpointing runs the forward again there."""

    def __init__(self, model: nn.Module):
        self.routers = routers(model)
        self.routes: Tensor | None = None
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._hook(layer))

    @contextlib.contextmanager
    def replaying(self, routes: Tensor | None) -> Iterator[None]:
        """routes [N, layers, k] (ids, NOT_RECORDED rows route themselves) for the N tokens of each forward
        inside; None replays nothing."""
        if routes is not None and routes.shape[1] != len(self.routers):
            raise ValueError(
                f"routed_experts has {routes.shape[1]} MoE layers, the trainer's model {len(self.routers)}: "
                "the rollout engine ran another architecture; set algorithm.routing_replay=false."
            )
        self.routes = routes
        try:
            yield
        finally:
            self.routes = None

    def _hook(self, layer: int):
        def hook(module: nn.Module, inputs: Any, output: Any) -> Any:
            if self.routes is None:
                return None
            logits, _, own = output
            want = self.routes[:, layer].to(device=own.device, dtype=own.dtype)
            if want.shape != own.shape:
                raise ValueError(
                    f"routing replay: recorded experts {tuple(want.shape)} for a forward routing "
                    f"{tuple(own.shape)} (tokens, k); the samples' routed_experts do not match their tokens."
                )
            ids = torch.where(want[:, :1] >= 0, want, own)
            return logits, replay_weights(module, logits, ids), ids

        return hook
