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
Two paths compute the experts (`MOE_PATHS`, the engine's `moe_path`):
- "dense" (`experts_forward`): every expert runs on every row with a zero weight where it was not chosen
  (adding 0 is exact), summed in ascending expert order, transformers' order, so it matches transformers
  bit for bit where the matmuls do; it costs E/k times the needed compute (16x for Qwen3-30B-A3B).
- "routed" (`experts_forward_routed`): the T*k (token, expert) pairs grouped by expert in pair order
  (`group_by_expert`: a counting sort at decode sizes, a stable sort above), their rows gathered,
  each expert's matmuls run on its contiguous range of rows only (a grouped matmul: `torch._grouped_mm` on
  CUDA, a loop over experts elsewhere), the rows put back in (token, slot) order and the k experts' scaled
  outputs summed per token in slot order. It sums the k experts in another order than "dense" (and its
  matmuls see other row counts), so bf16 results differ from "dense" at rounding; fp32 agrees to ~1e-6.
Neither has data-dependent shapes or a host sync on CUDA (the routed path always runs T*k rows, its group
offsets computed on the device and read there by `torch._grouped_mm`, bf16 only), so CUDA graphs capture
both, and `torch.compile` traces the routed one whole (dynamic shapes). The engine defaults to "routed" on a GPU
whose `torch._grouped_mm` runs it (`default_moe_path`) and to "dense" elsewhere.

Routing replay: `attn_out_routed` also returns each token's chosen experts; the runner writes them into a
[tokens, MoE layers, k] int16 tensor (`ascent.models.moe.ROUTES_DTYPE`), the same layout the reference
engine records, and every generation carries them as `routed_experts` (batching.py tells how).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ascent.models.families import ModelSpec
from ascent.rollout.fast.layers import LayerMath, rms_norm

MOE_PATHS = ("dense", "routed")
# the largest N*E (routed pairs times experts) `group_by_expert` counts rather than sorts: 1024 pairs (128
# rows x top-8) of 128 experts is 2^17; a 4096-token prefill at top-8 is 2^22 and sorts. The environment
# variable (bench/moe_tp.py --sort radix sets 0) reaches a TP replica's spawned ranks too.
COUNTING_SORT_MAX = int(os.environ.get("ASCENT_MOE_COUNTING_SORT_MAX", 2**20))
Experts = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


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
    # sorted (the default) on purpose: the slot order is the order of the renormalising sum and of the
    # combine's sum over slots, and the routes recorded for replay; unsorted top-k order is up to the kernel
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


def experts_forward_routed(h: Tensor, ids: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """`experts_forward` computing only the chosen experts (grouped matmuls over rows sorted by expert; the
    module doc tells how its sums differ). h [T, H], ids/weights [T, k], gate_up [E, 2I, H], down [E, H, I]
    -> [T, H]. T*k rows always, offsets on the device: no host sync on CUDA, CUDA graphs capture it.
    Eager peak beyond h: about 2 * T*k*H elements (each temporary is dropped once read: a prefill's rows)."""
    t, k = ids.shape
    order, slot, ends = group_by_expert(ids.reshape(-1), gate_up.shape[0])
    rows = h[order // k]  # [T*k, H]: each pair's token, grouped by expert
    gate_up_out = grouped_linear(rows, gate_up, ends)  # [T*k, 2I]
    del rows
    gate, up = gate_up_out.chunk(2, dim=-1)
    act = F.silu(gate).mul_(up)
    del gate_up_out, gate, up
    y = grouped_linear(act, down, ends)  # [T*k, H], sorted by expert
    del act
    # each pair's row of y (`slot`, the inverse of `order`): the combine is a gather, which torch.compile fuses
    # with the scaling and the sum over the k slots into one pass over T*k*H (a scatter back to (token, slot)
    # order, then the sum, took two compiled, three eager)
    scaled = y[slot].mul_(weights.reshape(-1, 1))  # [T*k, H] in (token, slot) order, scaled
    del y
    return scaled.view(t, k, -1).sum(dim=1)


def group_by_expert(ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """ids [N] each (token, slot) pair's expert (long) -> (order [N] long: the pairs grouped by expert, each
    expert's in pair order, `torch.sort(ids, stable=True)`'s permutation; slot [N] long: each pair's position
    in `order`, its inverse; ends [E] int32: each expert's last position + 1). Up to `COUNTING_SORT_MAX`
    elements of N*E (decode steps) a counting sort (`counting_group`), above it a radix sort
    (`sorting_group`): the same three tensors, so results are bit-identical either way. The switch reads
    shapes only: under torch.compile it is a guard, not a host sync."""
    if ids.shape[0] * num_experts <= COUNTING_SORT_MAX:
        return counting_group(ids, num_experts)
    return sorting_group(ids, num_experts)


def counting_group(ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """`group_by_expert` by counting: a pair's position is its expert's start plus the number of earlier
    pairs of its expert, from a running count over a one-hot [E, N] (int32; cumsum is deterministic, no
    atomics). O(N*E) elementwise work in a few kernels that torch.compile fuses, no sort and no searchsorted."""
    experts = torch.arange(num_experts, device=ids.device, dtype=ids.dtype)
    hits = (ids[None, :] == experts[:, None]).to(torch.int32)  # [E, N]: 1 where pair n chose expert e
    seen = hits.cumsum(1, dtype=torch.int32)  # [E, N]: pairs 0..n that chose expert e
    counts = hits.sum(1, dtype=torch.int32)  # [E]
    ends = counts.cumsum(0, dtype=torch.int32)
    # pair n's position: its expert's first row (ends - counts) plus the pairs of that expert before it
    slot = (ends - counts)[ids] + seen.gather(0, ids[None, :])[0] - 1
    slot = slot.long()
    order = torch.empty_like(slot).scatter_(0, slot, torch.arange(ids.shape[0], device=ids.device))
    return order, slot, ends


def sorting_group(ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """`group_by_expert` by a stable sort (prefills: its cost grows as N log N, the counting one's as N*E)."""
    sorted_ids, order = torch.sort(ids, stable=True)
    experts = torch.arange(num_experts, device=ids.device, dtype=sorted_ids.dtype)
    ends = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)
    slot = torch.empty_like(order).scatter_(0, order, torch.arange(ids.shape[0], device=ids.device))
    return order, slot, ends


def grouped_linear(x: Tensor, w: Tensor, ends: Tensor) -> Tensor:
    """x [N, K] rows grouped by expert (expert e's are rows [ends[e-1], ends[e])), w [E, out, K], ends [E]
    int32 -> [N, out]: each row times its expert's matrix. CUDA bf16: one `torch._grouped_mm` (no host
    sync); elsewhere a loop over the experts' row ranges (exact; it reads `ends` on the host, so on CUDA it
    syncs and CUDA graphs cannot capture it: `default_moe_path` picks "dense" there)."""
    if x.is_cuda and x.dtype == torch.bfloat16:
        return torch._grouped_mm(x, w.transpose(1, 2), offs=ends, out_dtype=x.dtype)
    return grouped_linear_loop(x, w, ends)


def grouped_linear_loop(x: Tensor, w: Tensor, ends: Tensor) -> Tensor:
    """`grouped_linear` as a loop over the experts with rows (the CPU path and the reference)."""
    out = x.new_empty(x.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = F.linear(x[start:end], w[e])
        start = end
    return out


def experts_path(moe_path: str) -> Experts:
    """The experts function of `moe_path` ("dense" or "routed", module doc)."""
    if moe_path not in MOE_PATHS:
        raise ValueError(f"moe_path={moe_path!r}: use one of {list(MOE_PATHS)}.")
    return experts_forward_routed if moe_path == "routed" else experts_forward


def default_moe_path(device: torch.device, moe_down: Tensor | None) -> str:
    """The engine's default `moe_path`: "routed" where `torch._grouped_mm` runs the experts whose stacked
    down_proj is `moe_down` [E, H, I] (bf16 on a CUDA GPU of compute capability 9.0+, H and I rows 16-byte
    aligned), else "dense" (also for a dense model: `moe_down` None)."""
    if moe_down is None or device.type != "cuda" or moe_down.dtype != torch.bfloat16:
        return "dense"
    aligned = all(n * moe_down.element_size() % 16 == 0 for n in moe_down.shape[1:])
    return "routed" if aligned and torch.cuda.get_device_capability(device) >= (9, 0) else "dense"


class MoeLayerMath(LayerMath):
    """`LayerMath` whose `attn_out` runs routed experts in the layers that have them (3-D `down_w`), through
    the experts function of `moe_path` (module doc)."""

    def __init__(self, spec: ModelSpec, moe_path: str = "dense"):
        super().__init__(spec)
        self.top_k, self.norm_topk = spec.experts_per_token, spec.norm_topk_prob
        self.experts = experts_path(moe_path)

    def attn_out(
        self,
        x: Tensor,
        attn: Tensor,
        o_w: Tensor,
        ln_w: Tensor,
        gate_up_w: tuple[Tensor, ...],
        down_w: Tensor,
    ) -> tuple[Tensor, Tensor | None]:
        """x [T, H] residual, attn [T, nh*d] -> `LayerMath.attn_out`'s (x, pending MLP output) in a dense
        layer; in an MoE layer (x after o_proj, residual add and the experts, None): nothing pending, as
        `attn_out_routed` (the experts' weighted sum ends in elementwise work the add can fuse with)."""
        if down_w.dim() == 2:
            return super().attn_out(x, attn, o_w, ln_w, gate_up_w, down_w)
        return self.attn_out_routed(x, attn, o_w, ln_w, gate_up_w, down_w)[0], None

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
        return x + self.experts(h, ids, weights, gate_up, down_w), ids


def layer_math(spec: ModelSpec, moe_path: str = "dense") -> LayerMath:
    """The layer functions of `spec`'s architecture: with routed experts (computed by `moe_path`) or dense."""
    return MoeLayerMath(spec, moe_path) if spec.is_moe else LayerMath(spec)
