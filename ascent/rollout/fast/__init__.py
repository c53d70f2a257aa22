"""The fast rollout engine: our own decoder forward over a paged KV cache with continuous batching.

Map: spec.py (architecture facts, read by the model's family in ascent/models/families) -> weights.py
(shared or owned tensors; IMPLEMENTATIONS, the layouts a family names) -> layers.py / attention.py /
triton_decode.py (math) -> runner.py (prefill, decode step) -> graphs.py (CUDA graphs) -> engine.py (the
engine's API) and batching.py (its loop); pages.py, prefix.py (prefix caching across requests),
scheduler.py, sequence.py, state.py and live.py are its bookkeeping, swap.py hands the weights to
publications between decode steps; vision.py runs a vision-language model's tower and multimodal RoPE
(images at prefill); action.py acts with a continuous action head (`model.action_head`) at prefill.
tensor_parallel.py (shards, all-reducing layer math), tp_comm.py (its all-reduce modes), tp_head.py (the
vocab-parallel LM head's sampling), tp_engine.py (the driver and the other ranks) and tp_launch.py
(starting a replica's ranks) spread one replica over several GPUs. `build_fast_engine` is the
builder registered as `ENGINES["fast"]`; options.py resolves and documents its options (`EngineOptions`).
On CPU the same engine runs eagerly (slowly) for the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ascent.models.action_head import ActionHeadSpec
from ascent.models.loading import load_tokenizer
from ascent.rollout.fast.action import ActionStep, load_action_head, without_head_tensors
from ascent.rollout.fast.engine import FastEngine
from ascent.rollout.fast.fp8 import quantize_weights, refuse_adapters
from ascent.rollout.fast.graphs import default_buckets
from ascent.rollout.fast.kv_cache import KVCache, pages_for_budget
from ascent.rollout.fast.moe import default_moe_path
from ascent.rollout.fast.options import EngineOptions, engine_options
from ascent.rollout.fast.pool import FreeBytes, PoolSizer, cuda_free_bytes
from ascent.rollout.fast.runner import ModelRunner
from ascent.rollout.fast.spec import ModelSpec, engine_family, rope_tables
from ascent.rollout.fast.tensor_parallel import DriverRunner, ShardRunner, TPGroup
from ascent.rollout.fast.tp_engine import TPEngine
from ascent.rollout.fast.tp_shard import shard_spec, shard_state_dict
from ascent.rollout.fast.vision import build_vision, is_vision_config, mrope_rows
from ascent.rollout.fast.weights import IMPLEMENTATIONS, load_state_dict, state_dict_of


def build_fast_engine(
    model_path: str | Path | None = None,
    model: nn.Module | None = None,
    dtype: str | torch.dtype = "bf16",
    device: str | torch.device = "auto",
    eos_token_ids: Sequence[int] | None = None,
    pad_token_id: int | None = None,
    decode: Callable[[list[int]], str] | None = None,
    gpu_memory_fraction: float = 0.5,
    max_batch_size: int = 256,
    max_model_len: int | None = None,
    *,
    tokenizer_path: str | Path | None = None,
    page_size: int = 64,
    kv_cache_tokens: int | None = None,
    cuda_graphs: bool | None = None,
    compile: bool | None = None,
    attention: str | None = None,
    sampler: str | None = None,
    moe_path: str | None = None,
    attn_options: dict | None = None,
    keep_sessions: bool = True,
    max_prefill_tokens: int = 16384,
    stop_check_interval: int = 8,
    share_weights: bool | None = None,
    trust_remote_code: bool = False,
    on_swap: str = "continue",
    feed_prompt_tokens: int = 256,
    tensor_parallel: TPGroup | int | None = None,
    vocab_parallel: bool = False,
    tp_allreduce: str | None = None,
    prefix_caching: bool = False,
    batch_invariant: bool = False,
    quantization: str = "none",
    action_head: ActionHeadSpec | None = None,
    free_memory: FreeBytes | None = None,
    **unused: Any,
) -> FastEngine:
    """A FastEngine on `model` (weights shared when dtype and device match) or the checkpoint at `model_path`.

    `eos_token_ids` and `decode` come from the tokenizer at `tokenizer_path` (default `model_path`) where not
    given (EOS else from the model's config); `pad_token_id` is taken for the engines' common signature
    (the engine never pads with a token). `tensor_parallel`: a number of ranks > 1 starts the replica's
    other ranks as child processes (tp_launch.py) and returns the driver, or a `TPGroup` is this process's
    rank of the replica (tp_engine.py: built on every rank, rank 0 drives, the others `serve()`; owned
    weights, sharded; every rank captures the same CUDA graphs). `free_memory` is the probe of free device
    bytes that caps the KV cache at build and every wake (pool.py; default on CUDA: the driver's, on CPU:
    none); `unused` swallows options meant for other engines. Every other argument is one of the engine's
    options: see the fields of `EngineOptions` (options.py) for what each does and what None picks.
    """
    call = {k: v for k, v in locals().items() if k != "unused"}
    options = engine_options(call)  # refuses what the engine cannot run before any rank starts
    if isinstance(tensor_parallel, int) and tensor_parallel > 1:
        return _launch_replica(tensor_parallel, call)
    tp = tensor_parallel if isinstance(tensor_parallel, TPGroup) and tensor_parallel.size > 1 else None
    return _assemble(options, tp, model_path, model, tokenizer_path, eos_token_ids, decode, free_memory)


def _launch_replica(size: int, call: dict[str, Any]) -> FastEngine:
    """A replica over `size` ranks: start the others as child processes (each builds its engine with
    `call`, its own device and its `TPGroup`), build the driver here and return it (tp_launch.py)."""
    from ascent.rollout.fast.tp_launch import launch_replica  # deferred: it calls this module's builder

    return launch_replica(size, call)


def _assemble(
    o: EngineOptions,
    tp: TPGroup | None,
    model_path: str | Path | None,
    model: nn.Module | None,
    tokenizer_path: str | Path | None,
    eos_token_ids: Sequence[int] | None,
    decode: Callable[[list[int]], str] | None,
    free_memory: FreeBytes | None,
) -> FastEngine:
    """One process's engine, or this rank's of a tensor-parallel replica (`tp`; None: one process): its
    weights, a KV cache sized to the memory they leave, the runner over both and the engine around it."""
    m = _load_model(model_path, model, o, tp)
    if o.fp8:
        quantize_weights(m.weights, o.device)
        if o.device.type == "cuda":  # the full precision's memory goes back before the KV cache is sized
            torch.cuda.empty_cache()
    _check_moe(m.spec, o.prefix_caching, o.batch_invariant)
    eos_token_ids, decode = _tokenizer_facts(
        tokenizer_path or model_path, eos_token_ids, decode, o.trust_remote_code
    )
    pool, pages, tp = _kv_pool(m, o, tp, free_memory)
    runner = _runner(m, KVCache(m.spec, pages, o.page_size, o.dtype, o.device), o, tp)
    if o.action_head is not None:  # acts at prefill (action.py); a given module's own head is shared
        head = load_action_head(o.action_head, m.spec.hidden_size, o.device, model_path, model)
        runner.action = ActionStep(head, o.action_head.token_id)
    engine_cls: Callable[..., FastEngine] = (
        FastEngine if tp is None else partial(TPEngine, full_spec=m.full_spec)
    )
    engine = engine_cls(
        runner,
        m.weights,
        eos_token_ids=list(eos_token_ids if eos_token_ids is not None else _config_eos(m.config)),
        decode=decode,
        max_batch_size=o.max_batch_size,
        max_model_len=m.max_len,
        buckets=default_buckets(o.max_batch_size) if o.cuda_graphs else None,
        keep_sessions=o.keep_sessions,
        max_prefill_tokens=o.max_prefill_tokens,
        stop_check_interval=o.stop_check_interval,
        on_swap=o.on_swap,
        feed_prompt_tokens=o.feed_prompt_tokens,
        vision=m.vision,
        prefix_caching=o.prefix_caching,
        batch_invariant=o.batch_invariant,
        pool=pool,
    )
    if o.fp8:  # an adapter-only publication merges into full-precision bases, which an FP8 engine lacks
        engine.adapters.read = refuse_adapters
    return engine


class _Model(NamedTuple):
    """A checkpoint loaded for the engine: its config, its spec (this rank's shard under tensor parallelism;
    `full_spec` the whole model's), the engine's weights, the vision tower (or None) and the context."""

    config: Any
    spec: ModelSpec
    full_spec: ModelSpec
    weights: Any
    vision: Any
    max_len: int


def _load_model(
    model_path: str | Path | None, model: nn.Module | None, o: EngineOptions, tp: TPGroup | None
) -> _Model:
    """The family's engine implementation on the weights of `model` or `model_path` (this rank's shard under
    tensor parallelism), and a vision-language model's tower on the same state dict (vision.py)."""
    dt, dev = o.dtype, o.device
    config, sd, share = _weights_source(model_path, model, dt, dev, o.share_weights, o.trust_remote_code)
    family = engine_family(config)  # models/families: which implementation, which names, which spec
    assert family.engine is not None and family.spec is not None  # engine_family checked them
    spec = full_spec = family.spec(config)
    max_len = _max_len(spec, o.max_model_len)
    if tp is not None:  # this rank's shard: a model with its share of the heads and the MLP
        sd = shard_state_dict(sd, full_spec, tp.rank, tp.size, family.to_engine_name)
        spec = shard_spec(full_spec, tp.size)
    weights = IMPLEMENTATIONS[family.engine](sd, spec, dt, dev, share, rename=family.to_engine_name)
    vision = None
    if is_vision_config(config):  # the tower: transformers' module on the same state dict (vision.py)
        renamed = {family.to_engine_name(n): t for n, t in sd.items()}
        vision, tower_targets = build_vision(config, renamed, dt, dev, share)
        weights.targets.update(tower_targets)
    return _Model(config, spec, full_spec, weights, vision, max_len)


def _weights_source(model_path, model, dt, dev, share_weights, trust_remote_code=False):
    """-> (HF config, state dict by HF name, whether to share the tensors instead of copying them)."""
    if model is None and model_path is None:
        raise ValueError("rollout.engine=fast needs model.path (or a model module) to load weights from.")
    if model is not None:
        sd = without_head_tensors(state_dict_of(model))  # an action head is the engine's own (action.py)
        can_share = all(t.dtype == dt and t.device == dev for t in sd.values())
        return model.config, sd, can_share if share_weights is None else (share_weights and can_share)
    from transformers import AutoConfig  # deferred: transformers, slow to import

    config = AutoConfig.from_pretrained(
        str(model_path), local_files_only=True, trust_remote_code=trust_remote_code
    )
    return config, load_state_dict(str(model_path)), False


def _kv_pool(
    m: _Model, o: EngineOptions, tp: TPGroup | None, free_memory: FreeBytes | None
) -> tuple[PoolSizer, int, TPGroup | None]:
    """-> (the pool's sizer, the KV cache's pages, the group summing with `o.tp_allreduce`). Under tensor
    parallelism every rank's cache has the pages the driver's tables name, and the group sets up its
    all-reduce (sized for a decode step's sums) before the pool settles on what is free then."""
    reserve = _activation_reserve(m.spec, o.max_batch_size, o.max_prefill_tokens, o.dtype)
    pool = _pool_sizer(m, o, reserve, free_memory)
    pages = pool.fit()
    if tp is not None:
        pages = tp.min(pages)
        tp = tp.with_allreduce(o.tp_allreduce, o.max_batch_size * m.spec.hidden_size)
    return pool, pool.settle(pages), tp


def _activation_reserve(spec: ModelSpec, max_batch_size: int, max_prefill_tokens: int, dtype) -> int:
    """Bytes kept free for activations: decode logits + sampler temporaries, prefill MLP + attention."""
    elt = torch.empty((), dtype=dtype).element_size()
    decode = max_batch_size * spec.vocab_size * 4 * 8
    prefill = max_prefill_tokens * (3 * spec.intermediate_size + 8 * spec.hidden_size) * elt * 2
    return decode + prefill + (512 << 20)


def _pool_sizer(m: _Model, o: EngineOptions, reserve: int, free_memory: FreeBytes | None) -> PoolSizer:
    """What the run asks (`kv_cache_tokens`, else `gpu_memory_fraction` of the GPU, else on CPU
    max_batch_size full sequences) and the free-memory probe that caps it at build and every wake (pool.py;
    on CUDA by default the driver's free bytes)."""
    dev, page_size, fraction = o.device, o.page_size, o.gpu_memory_fraction
    asked = _num_pages(
        m.spec, o.dtype, dev, page_size, o.kv_cache_tokens, fraction, o.max_batch_size, m.max_len, reserve
    )
    if free_memory is None and dev.type == "cuda":
        free_memory = cuda_free_bytes(dev)
    by = f"rollout.gpu_memory_fraction={fraction}"
    if o.kv_cache_tokens is not None:
        by = f"kv_cache_tokens={o.kv_cache_tokens}"
    elif dev.type != "cuda":
        by = f"max_batch_size={o.max_batch_size} x max_model_len={m.max_len} (CPU)"
    return PoolSizer(
        asked=asked,
        least=-(-m.max_len // page_size) + 1,
        page_size=page_size,
        page_bytes=m.spec.kv_bytes_per_token(o.dtype) * page_size,
        margin=reserve,
        free_bytes=free_memory,
        asked_by=by,
        device=str(dev),
    )


def _num_pages(spec, dtype, device, page_size, kv_cache_tokens, fraction, max_batch, max_len, reserve) -> int:
    if kv_cache_tokens is not None:
        return -(-kv_cache_tokens // page_size) + 1
    if device.type == "cuda":
        return pages_for_budget(spec, dtype, device, fraction, page_size, reserve)
    return max_batch * -(-max_len // page_size) + 1


def _runner(m: _Model, cache: KVCache, o: EngineOptions, tp: TPGroup | None) -> ModelRunner:
    """The model runner over `cache`: one process's, or this rank's of a tensor-parallel replica (rank 0
    drives, the others follow)."""
    dev = cache.device
    text_config = getattr(m.config, "text_config", None) or m.config  # a vision-language model's decoder
    rope = rope_tables(text_config, m.spec, m.max_len, m.weights.embed.dtype, dev)  # the residual's dtype
    tp_kw: dict[str, Any] = {} if tp is None else {"tp": tp, "vocab_parallel": o.vocab_parallel}
    runner_cls = ModelRunner if tp is None else DriverRunner if tp.rank == 0 else ShardRunner
    return runner_cls(
        m.spec,
        m.weights,
        cache,
        rope,
        m.max_len,
        mrope_rows=mrope_rows(m.spec).to(dev) if m.vision is not None else None,
        allowed=m.vision.allowed(m.spec.vocab_size, m.config) if m.vision is not None else None,
        attention=o.attention,
        compile=o.compile,
        attn_options=o.attn_options,
        sampler=o.sampler,
        batch_invariant=o.batch_invariant,
        moe_path=o.moe_path or default_moe_path(dev, _moe_down(m.weights)),
        **tp_kw,
    )


def _tokenizer_facts(path, eos_token_ids, decode, trust_remote_code=False):
    """Fill EOS ids and decode from the tokenizer at `path` where not given."""
    if path is None or (eos_token_ids is not None and decode is not None):
        return eos_token_ids, decode
    if not (Path(path) / "tokenizer_config.json").exists():
        return eos_token_ids, decode

    tok = load_tokenizer(path, trust_remote_code)
    eos_token_ids = eos_token_ids if eos_token_ids is not None else [tok.eos_token_id]
    return eos_token_ids, decode or tok.decode


def _config_eos(config: Any) -> list[int]:
    eos = getattr(config, "eos_token_id", None)
    if eos is None:  # a vision-language config keeps it in its text part
        eos = getattr(getattr(config, "text_config", None), "eos_token_id", None)
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _check_moe(spec: ModelSpec, prefix_caching: bool, batch_invariant: bool) -> None:
    """Mixture-of-experts models need every row's routes for replay: refuse the modes that lose them."""
    if spec.num_experts and (prefix_caching or batch_invariant):
        raise ValueError(
            f"prefix_caching={prefix_caching}, batch_invariant={batch_invariant} with a mixture-of-experts "
            "model: neither records the experts routing replay needs (cached pages hold no routes, and rows "
            "run alone write no batch's routes); set rollout.prefix_caching=false and "
            "rollout.batch_invariant=false."
        )


def _max_len(spec: Any, max_model_len: int | None) -> int:
    """The engine's context: max_model_len or the model's; refused past a sliding window (not supported)."""
    max_len = int(max_model_len or spec.max_position_embeddings)
    if spec.sliding_window is not None and spec.sliding_window < max_len:
        raise ValueError(
            f"sliding_window={spec.sliding_window} < max_model_len={max_len}: the fast engine has "
            "no sliding-window attention; set max_model_len <= the window."
        )
    return max_len


def _moe_down(weights: Any) -> Tensor | None:
    """The first mixture-of-experts layer's stacked down_proj [E, H, I] (3-D), None for a dense model."""
    return next((lw.down_w for lw in weights.layers if lw.down_w.dim() == 3), None)


__all__ = ["EngineOptions", "FastEngine", "TPEngine", "TPGroup", "build_fast_engine"]
