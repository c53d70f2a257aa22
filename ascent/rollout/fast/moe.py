"""The fast engine's mixture-of-experts layer (Qwen3-MoE): its weights and its math.

Weights. An MoE layer's MLP is a router `mlp.gate.weight` [E, H] and E SwiGLU experts held stacked, as
transformers holds them in memory: `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows, then up rows) and
`mlp.experts.down_proj` [E, H, I]. A checkpoint on disk names them per expert
(`mlp.experts.N.gate_proj.weight`, ...): owned weights stack those once at load; updates (the trainer's
publications) come stacked. In `LayerWeights` an MoE layer's `gate_up_w` is `(router, gate_up)` and its
`down_w` is the 3-D `down` (a dense layer's `down_w` is 2-D): `MoeLayerMath.attn_out` tells them apart by
that, so the runner calls every layer alike.

Math, as transformers' `Qwen3MoeSparseMoeBlock`: router logits in the weights' dtype, softmax in fp32, the
top-k experts by probability, their weights renormalised to sum 1 (`norm_topk_prob`) and cast to the
logits' dtype; each expert's output scaled by its weight, summed over experts in ascending expert order.
Every expert runs on every row with a zero weight where it was not chosen (adding 0 is exact), so a step
has no data-dependent shapes and no host sync (CUDA graphs capture it); that costs E/k times the routed
compute, fine for the tiny models of the tests, and a grouped matmul is the fast path still to write.

Routing replay: `attn_out_routed` also returns each token's chosen experts; the runner writes them into a
[tokens, MoE layers, k] int16 tensor (`ascent.models.moe.ROUTES_DTYPE`), the same layout the reference
engine records, and every generation carries them as `routed_experts` (batching.py tells how).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ascent.models.families import ModelSpec
from ascent.rollout.fast.layers import LayerMath, rms_norm


def is_moe_mlp(sd: Mapping[str, Tensor], mlp: str) -> bool:
    """Whether the MLP under prefix `mlp` ("model.layers.N.mlp.") is routed experts (it has a router)."""
    return mlp + "gate.weight" in sd


def _stacked(sd: Mapping[str, Tensor], mlp: str) -> tuple[Tensor, Tensor]:
    """(gate_up [E, 2I, H], down [E, H, I]) of one MoE MLP, from stacked names or per-expert ones."""
    ex = mlp + "experts."
    if ex + "gate_up_proj" in sd:
        return sd[ex + "gate_up_proj"], sd[ex + "down_proj"]
    n = 0
    while f"{ex}{n}.gate_proj.weight" in sd:
        n += 1
    if n == 0:
        raise KeyError(
            f"checkpoint has a router {mlp}gate.weight but no experts under {ex}; is it Qwen3-MoE?"
        )
    gate_up = torch.stack(
        [torch.cat([sd[f"{ex}{e}.gate_proj.weight"], sd[f"{ex}{e}.up_proj.weight"]]) for e in range(n)]
    )
    return gate_up, torch.stack([sd[f"{ex}{e}.down_proj.weight"] for e in range(n)])


def shared_experts(sd: Mapping[str, Tensor], mlp: str) -> tuple[tuple[Tensor, ...], Tensor]:
    """(gate_up_w, down_w) of `LayerWeights` for an MoE MLP, using the trainer's stacked tensors as they are."""
    ex = mlp + "experts."
    if ex + "gate_up_proj" not in sd:
        raise ValueError(
            f"cannot share weights: {ex}gate_up_proj is missing (share a loaded Qwen3-MoE model)."
        )
    return (sd[mlp + "gate.weight"], sd[ex + "gate_up_proj"]), sd[ex + "down_proj"]


def owned_experts(
    sd: Mapping[str, Tensor], mlp: str, dtype: torch.dtype, device: torch.device, targets: dict[str, Tensor]
) -> tuple[tuple[Tensor, ...], Tensor]:
    """(gate_up_w, down_w) of `LayerWeights` for an MoE MLP, copied into `dtype` on `device` (stacked); the
    stacked and router names join `targets`, the names `update` accepts."""
    gate_up, down = _stacked(sd, mlp)
    own = {
        mlp + "gate.weight": sd[mlp + "gate.weight"],
        mlp + "experts.gate_up_proj": gate_up,
        mlp + "experts.down_proj": down,
    }
    for name, t in own.items():
        targets[name] = t.to(device=device, dtype=dtype).clone()
    return (targets[mlp + "gate.weight"], targets[mlp + "experts.gate_up_proj"]), targets[
        mlp + "experts.down_proj"
    ]


def route(logits: Tensor, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """Router logits [T, E] -> (expert ids [T, k] long, weights [T, k] in the logits' dtype)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top, ids = torch.topk(probs, k, dim=-1)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return ids, top.to(logits.dtype)


def experts_forward(h: Tensor, ids: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """h [T, H], ids/weights [T, k], gate_up [E, 2I, H], down [E, H, I] -> [T, H]: the weighted sum of each
    token's chosen experts, experts in ascending order (see the module doc)."""
    num_experts = gate_up.shape[0]
    combine = torch.zeros(h.shape[0], num_experts, dtype=weights.dtype, device=h.device)
    combine.scatter_(1, ids, weights)  # [T, E]: the token's weight for each expert, 0 where not chosen
    out = torch.zeros_like(h)
    for e in range(num_experts):
        gate, up = F.linear(h, gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down[e])
        out = out + (y * combine[:, e, None]).to(out.dtype)
    return out


class MoeLayerMath(LayerMath):
    """`LayerMath` whose `attn_out` runs routed experts in the layers that have them (3-D `down_w`)."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec)
        self.top_k, self.norm_topk = spec.experts_per_token, spec.norm_topk_prob

    def attn_out(
        self,
        x: Tensor,
        attn: Tensor,
        o_w: Tensor,
        ln_w: Tensor,
        gate_up_w: tuple[Tensor, ...],
        down_w: Tensor,
    ) -> Tensor:
        """x [T, H] residual, attn [T, nh*d] -> x after o_proj, residual add and the MLP (experts or dense)."""
        if down_w.dim() == 2:
            return super().attn_out(x, attn, o_w, ln_w, gate_up_w, down_w)
        return self.attn_out_routed(x, attn, o_w, ln_w, gate_up_w, down_w)[0]

    def attn_out_routed(
        self,
        x: Tensor,
        attn: Tensor,
        o_w: Tensor,
        ln_w: Tensor,
        gate_up_w: tuple[Tensor, ...],
        down_w: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """`attn_out` of an MoE layer (3-D `down_w`) -> (x [T, H], the chosen expert ids [T, k] long), the
        ids for routing replay (the runner records them, runner.py)."""
        router, gate_up = gate_up_w
        x = x + F.linear(attn, o_w)
        h = rms_norm(x, ln_w, self.eps).to(down_w.dtype)
        ids, weights = route(F.linear(h, router), self.top_k, self.norm_topk)
        return x + experts_forward(h, ids, weights, gate_up, down_w), ids


def layer_math(spec: ModelSpec) -> LayerMath:
    """The layer functions of `spec`'s architecture: with routed experts or dense."""
    return MoeLayerMath(spec) if spec.is_moe else LayerMath(spec)
