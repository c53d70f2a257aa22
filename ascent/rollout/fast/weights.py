"""The fast engine's view of a model's weights, in Hugging Face naming, shared or owned.

Two ways to hold them:
- **shared**: the tensors of a trainer's `nn.Module` living on the same device in the same dtype are used
  as they are (no copy). The trainer's in-place optimizer steps are seen by the next rollout directly.
- **owned**: a private copy in the engine's dtype, with q/k/v fused into one matrix and gate/up into another
  (fewer, larger matrix products per decode step).

Owned weights keep what the trainer keeps in fp32 under autocast in fp32: the RMSNorm scales and the
embedding table (the residual stream starts from its rows). A tied LM head then gets its own copy in the
engine's dtype for the head matmul, refreshed whenever the embedding is written.

Either way `targets` maps every engine name (the HF name, for the Llama-like families of
`ascent.models.families`) to the tensor (or the slice of a fused tensor) that holds it; `rename`, the
family's `to_engine_name`, turns a checkpoint's or a trainer's names into engine names on the way in. So
`update_weights` is one `copy_` per incoming tensor and never moves an address a captured CUDA graph reads.

Owned weights can be **released** while the engine sleeps (`release()`): every distinct storage shrinks to 0
bytes, the tensor objects and their views stay. The next `update` re-allocates them (new addresses: the
engine drops its CUDA graphs on sleep anyway) and records which memory regions it wrote; `missing()` names
those still unwritten, so the engine refuses to run on half-refreshed weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, overload

import torch
from torch import Tensor

from ascent.models.families import ModelSpec, same_name
from ascent.rollout.fast.moe import is_moe_mlp, owned_experts, shared_experts


@dataclass
class LayerWeights:
    """One decoder layer. `qkv_w` holds one fused [q+2kv, H] matrix or three; `gate_up_w` one or two. An MoE
    layer holds `gate_up_w = (router [E, H], experts' gate_up [E, 2I, H])` and `down_w` [E, H, I] (moe.py)."""

    ln1: Tensor  # [H]
    ln2: Tensor  # [H]
    qkv_w: tuple[Tensor, ...]
    qkv_b: tuple[Tensor | None, ...]
    o_w: Tensor  # [H, nh*d]
    q_norm: Tensor | None  # [d] (Qwen3)
    k_norm: Tensor | None  # [d]
    gate_up_w: tuple[Tensor, ...]
    down_w: Tensor  # [H, I]


@dataclass
class ModelWeights:
    """All weights plus `targets`: engine name -> tensor view that `update` copies into; `rename` maps the
    names `update` receives (checkpoint / trainer names) to engine names."""

    embed: Tensor  # [V, H]
    norm: Tensor  # [H]
    lm_head: Tensor  # [V, H] (the embedding itself when tied)
    layers: list[LayerWeights]
    targets: dict[str, Tensor]
    shared: bool
    head_copy: bool = False  # lm_head is a rounded copy of the tied (fp32) embedding, refreshed by `update`
    rename: Callable[[str], str] = same_name  # checkpoint name -> engine name (the family's to_engine_name)
    # engine name -> how `update` writes it instead of a copy (FP8 weights quantise on receipt: fp8.py)
    writers: dict[str, Callable[[Tensor], None]] = field(default_factory=dict)

    released: bool = False  # storages are 0 bytes (between `release()` and the next `update`)
    writes: int = 0  # tensors `update` has copied in, ever (a publication failing after one left them mixed)
    _storages: list[tuple[torch.UntypedStorage, int]] = field(default_factory=list, repr=False)
    _region_of: dict[str, int] = field(default_factory=dict, repr=False)  # name -> memory region id
    _pending: set[int] = field(default_factory=set, repr=False)  # regions not written since `release()`

    def update(self, named_tensors: Iterable[tuple[str, Tensor]] | Mapping[str, Tensor]) -> int:
        """Copy new values in place, tensor by tensor (any device or dtype); -> number of tensors copied.

        An unknown name is an error (rotary buffers are skipped); a tensor that already is the engine's
        storage (shared weights) is not copied. Released weights are re-allocated first (uninitialised
        until written: see `missing`).
        """
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        self._reallocate()
        copied, embed_written = 0, False
        with torch.no_grad():
            for name, tensor in items:
                key = self.rename(name)
                target = self.targets.get(key)
                if target is None:
                    if name.endswith("rotary_emb.inv_freq"):
                        continue
                    raise KeyError(
                        f"update_weights: the engine has no parameter named {name!r} (names look like "
                        "model.layers.0.self_attn.q_proj.weight); send Hugging Face names without wrapper "
                        "prefixes such as 'module.'."
                    )
                if tensor.shape != target.shape:
                    raise ValueError(
                        f"update_weights: {name} has shape {tuple(tensor.shape)}, "
                        f"the engine holds {tuple(target.shape)}."
                    )
                if tensor.data_ptr() == target.data_ptr() and tensor.dtype == target.dtype:
                    continue
                write = self.writers.get(key)
                if write is not None:
                    write(tensor)
                else:
                    target.copy_(tensor, non_blocking=True)
                copied += 1
                self.writes += 1
                embed_written |= target is self.embed
                if self._pending:
                    self._pending.discard(self._region_of[key])
            if self.head_copy and embed_written:
                self.lm_head.copy_(self.embed)
        return copied

    def release(self) -> int:
        """Free the memory of the owned weights (each distinct storage resized to 0 bytes); -> bytes freed.

        Tensor objects, views and fused slices stay (shape, dtype, device); reading them is an error until
        `update` writes every region again. Shared weights are the trainer's tensors: never freed (-> 0).
        """
        if self.shared:
            return 0
        freed = 0
        if not self.released:
            self._region_of = _regions(self.targets)
            self._storages = [(s, s.nbytes()) for s in _distinct_storages(self._tensors())]
            for s, nbytes in self._storages:
                s.resize_(0)
                freed += nbytes
            self.released = True
        self._pending = set(self._region_of.values())
        return freed

    def _reallocate(self) -> None:
        """Give released storages their bytes back (contents undefined until `update` writes them)."""
        if self.released:
            for s, nbytes in self._storages:
                s.resize_(nbytes)
            self.released = False

    def missing(self) -> list[str]:
        """HF names of the regions not written since `release()` (one name per tied region); [] when whole."""
        seen: set[int] = set()
        out = []
        for name, region in self._region_of.items():
            if region in self._pending and region not in seen:
                seen.add(region)
                out.append(name)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of owned weight storage allocated now (0 when released or when the weights are shared)."""
        if self.shared:
            return 0
        return sum(s.nbytes() for s in _distinct_storages(self._tensors()))

    def stamp(self) -> tuple[int, ...]:
        """Changes whenever a weight is written in place (autograd's version counters): how the engine tells
        that a trainer stepped shared weights (writes through `.data` are not counted)."""
        return tuple(t._version for t in self._tensors())

    def _tensors(self) -> list[Tensor]:
        """Every weight tensor: the update targets and the tied head's copy."""
        return [*self.targets.values(), self.lm_head]


def _distinct_storages(tensors: Iterable[Tensor]) -> list[torch.UntypedStorage]:
    """Each storage behind `tensors` once (fused q/k/v slices, tied embedding and head share one)."""
    by_ptr = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in tensors}
    return list(by_ptr.values())


def _regions(targets: dict[str, Tensor]) -> dict[str, int]:
    """HF name -> id of the memory region it covers; names aliasing the same region (tied) share an id."""
    ids: dict[tuple, int] = {}
    out = {}
    for name, t in targets.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        out[name] = ids.setdefault(key, len(ids))
    return out


def _prefix(i: int) -> str:
    return f"model.layers.{i}."


@overload
def _get(sd: Mapping[str, Tensor], name: str, required: Literal[True] = True) -> Tensor: ...
@overload
def _get(sd: Mapping[str, Tensor], name: str, required: bool) -> Tensor | None: ...
def _get(sd: Mapping[str, Tensor], name: str, required: bool = True) -> Tensor | None:
    if name in sd:
        return sd[name]
    if required:
        raise KeyError(f"checkpoint has no tensor {name!r}; is this a Llama-like causal LM?")
    return None


def _shared_layer(sd: Mapping[str, Tensor], i: int, targets: dict[str, Tensor]) -> LayerWeights:
    """Layer i using the given tensors as they are (no copy, no fusion)."""
    p = _prefix(i)
    names = [n for n in sd if n.startswith(p)]
    for n in names:
        targets[n] = sd[n]
    att, mlp = p + "self_attn.", p + "mlp."
    if is_moe_mlp(sd, mlp):
        gate_up_w, down_w = shared_experts(sd, mlp)
    else:
        gate_up_w, down_w = (
            (sd[mlp + "gate_proj.weight"], sd[mlp + "up_proj.weight"]),
            sd[mlp + "down_proj.weight"],
        )
    return LayerWeights(
        ln1=sd[p + "input_layernorm.weight"],
        ln2=sd[p + "post_attention_layernorm.weight"],
        qkv_w=tuple(sd[f"{att}{x}_proj.weight"] for x in "qkv"),
        qkv_b=tuple(sd.get(f"{att}{x}_proj.bias") for x in "qkv"),
        o_w=sd[att + "o_proj.weight"],
        q_norm=sd.get(att + "q_norm.weight"),
        k_norm=sd.get(att + "k_norm.weight"),
        gate_up_w=gate_up_w,
        down_w=down_w,
    )


def _fused(parts: list[tuple[str, Tensor]], dtype, device, targets: dict[str, Tensor]) -> Tensor:
    """Concatenate tensors along dim 0 into one owned tensor; register each slice under its name."""
    fused = torch.cat([t.to(device=device, dtype=dtype) for _, t in parts], dim=0)
    start = 0
    for name, t in parts:
        targets[name] = fused[start : start + t.shape[0]]
        start += t.shape[0]
    return fused


# The residual stream runs in fp32 (layers.py) and the RMSNorm scales stay fp32 like the trainer's master
# weights: [H] per norm, nothing next to the matrices. The embedding table stays fp32 too: the trainer's
# residual stream starts from fp32 rows, and rounding them to bf16 moved single logprobs by up to 0.8 nat
# on an SFT'd model (BENCHMARKS.md). It costs vocab x hidden x 2 more bytes than a bf16 table (a tied head
# adds a bf16 copy for the head matmul).
NORM_DTYPE = torch.float32
EMBED_DTYPE = torch.float32


def _owned_layer(sd: Mapping[str, Tensor], i: int, dtype, device, targets: dict[str, Tensor]) -> LayerWeights:
    """Layer i copied into `dtype` on `device`, with q/k/v and gate/up fused."""
    p = _prefix(i)
    att, mlp = p + "self_attn.", p + "mlp."

    def own(name: str, dt: torch.dtype = dtype) -> Tensor:
        targets[name] = _get(sd, name).to(device=device, dtype=dt).clone()
        return targets[name]

    def own_optional(name: str, dt: torch.dtype = dtype) -> Tensor | None:
        return own(name, dt) if name in sd else None

    qkv_names = [f"{att}{x}_proj.weight" for x in "qkv"]
    qkv_w = _fused([(n, _get(sd, n)) for n in qkv_names], dtype, device, targets)
    bias_names = [f"{att}{x}_proj.bias" for x in "qkv"]
    qkv_b = None
    if all(n in sd for n in bias_names):
        qkv_b = _fused([(n, sd[n]) for n in bias_names], dtype, device, targets)
    ln1 = own(p + "input_layernorm.weight", NORM_DTYPE)  # fp32, as the trainer's master weights
    ln2 = own(p + "post_attention_layernorm.weight", NORM_DTYPE)
    o_w = own(att + "o_proj.weight")
    q_norm = own_optional(att + "q_norm.weight", NORM_DTYPE)  # fp32 * bf16 q -> fp32, as HF under autocast
    k_norm = own_optional(att + "k_norm.weight", NORM_DTYPE)
    if is_moe_mlp(sd, mlp):  # routed experts, stacked (moe.py)
        gate_up_w, down_w = owned_experts(sd, mlp, dtype, device, targets)
    else:
        gu_names = [mlp + "gate_proj.weight", mlp + "up_proj.weight"]
        gate_up_w = (_fused([(n, _get(sd, n)) for n in gu_names], dtype, device, targets),)
        down_w = own(mlp + "down_proj.weight")
    return LayerWeights(ln1, ln2, (qkv_w,), (qkv_b,), o_w, q_norm, k_norm, gate_up_w, down_w)


def _check_supported(sd: Mapping[str, Tensor], spec: ModelSpec) -> None:
    """Raise for weights our forward would silently ignore (o_proj or MLP biases)."""
    p = _prefix(0)
    extra = [n for n in ("self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.down_proj.bias") if p + n in sd]
    if extra:
        raise ValueError(
            f"checkpoint has {extra}: the fast engine has no o_proj/MLP biases; use the reference engine."
        )
    qkv_bias = [p + f"self_attn.{x}_proj.bias" in sd for x in "qkv"]
    if any(qkv_bias) and not all(qkv_bias):
        raise ValueError("checkpoint has biases on some of q/k/v only; the fast engine needs all or none.")


def build_weights(
    sd: Mapping[str, Tensor],
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    share: bool,
    rename: Callable[[str], str] = same_name,
) -> ModelWeights:
    """State dict (name -> tensor) -> ModelWeights of the "decoder" layout; `share=True` uses the tensors
    without copying. `rename` maps the state dict's names to the engine's (HF Llama names).

    Sharing requires every tensor to already be on `device` in `dtype`; otherwise pass share=False.
    """
    sd = {rename(n): t for n, t in sd.items()}
    _check_supported(sd, spec)
    targets: dict[str, Tensor] = {}
    if share:
        bad = [n for n, t in sd.items() if t.dtype != dtype or t.device != device]
        if bad:
            raise ValueError(f"cannot share weights: {bad[0]} is {sd[bad[0]].dtype} on {sd[bad[0]].device}.")
        layers = [_shared_layer(sd, i, targets) for i in range(spec.num_layers)]
        targets["model.embed_tokens.weight"] = embed = sd["model.embed_tokens.weight"]
        targets["model.norm.weight"] = norm = sd["model.norm.weight"]
    else:
        layers = [_owned_layer(sd, i, dtype, device, targets) for i in range(spec.num_layers)]
        embed = targets["model.embed_tokens.weight"] = (
            sd["model.embed_tokens.weight"].to(device, EMBED_DTYPE).clone()
        )
        norm = targets["model.norm.weight"] = sd["model.norm.weight"].to(device, NORM_DTYPE).clone()
    tied = spec.tie_word_embeddings or "lm_head.weight" not in sd
    if tied:  # both names write the embedding; a head in another dtype is a copy of it
        lm_head = embed if share or dtype == embed.dtype else embed.to(dtype)
        targets["lm_head.weight"] = embed
    else:
        lm_head = sd["lm_head.weight"] if share else sd["lm_head.weight"].to(device, dtype).clone()
        targets["lm_head.weight"] = lm_head
    return ModelWeights(
        embed=embed,
        norm=norm,
        lm_head=lm_head,
        layers=layers,
        targets=targets,
        shared=share,
        head_copy=tied and lm_head is not embed,
        rename=rename,
    )


# The fast engine's implementations by the key a family names (`Family.engine`): each builds the weights its
# forward reads from a state dict, a ModelSpec, the dtype, the device, whether to share, and the renaming.
IMPLEMENTATIONS: dict[str, Callable[..., ModelWeights]] = {"decoder": build_weights}


def state_dict_of(model: torch.nn.Module) -> dict[str, Tensor]:
    """The module's tensors by HF name, detached but sharing storage (tied names both present)."""
    return {n: t.detach() for n, t in model.state_dict(keep_vars=True).items()}


def load_state_dict(path: str) -> dict[str, Tensor]:
    """Read every *.safetensors file of a local checkpoint directory onto the CPU."""

    from safetensors.torch import load_file  # deferred: safetensors, only when weights are read or written

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model_path={path!r} holds no *.safetensors files.")
    sd: dict[str, Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd
