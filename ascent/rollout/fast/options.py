"""How the fast engine is built: `EngineOptions`, one field per option of `build_fast_engine`, resolved.

`engine_options` turns the builder's arguments into them before anything is loaded or any rank started:
it refuses the combinations the engine cannot run (naming the setting and the fix), applies the
ASCENT_FAST_ENGINE overrides (`debug_overrides`) and picks each default the device decides. What only the
weights can decide (`max_model_len` None, `moe_path` None) stays None here and is settled in the builder
(`ascent.rollout.fast.build_fast_engine`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ascent.models.action_head import ActionHeadSpec
from ascent.models.loading import compute_dtype, resolve_device
from ascent.rollout.fast.fp8 import QUANTIZATIONS, Fp8Error, check_fp8_device
from ascent.rollout.fast.moe import experts_path
from ascent.rollout.fast.tensor_parallel import TPGroup
from ascent.rollout.fast.tp_comm import check_allreduce

DEBUG_KEYS = ("cuda_graphs", "compile", "attention", "sampler", "moe_path", "vocab_parallel", "tp_allreduce")
# the paths whose results depend on the batch's shape, off in the batch-invariant mode (runner.py)
BATCH_INVARIANT = {"cuda_graphs": False, "compile": False, "attention": "torch", "sampler": "torch"}


@dataclass(frozen=True)
class EngineOptions:
    """The options one engine (one process, or one rank of a tensor-parallel replica) is built with."""

    # where and in what precision: "auto" picks a GPU when there is one; a CUDA device always gets its
    # index (the current device's when none was given); `dtype` ("bf16", "fp32", ...) is the compute dtype,
    # refused where the device cannot compute in it
    device: torch.device
    dtype: torch.dtype
    # the most sequences decoding at once (one row each; also the largest CUDA graph bucket)
    max_batch_size: int
    # the engine's context; None: the model's max_position_embeddings (refused past a sliding window)
    max_model_len: int | None
    # the KV cache: pages of `page_size` tokens; `kv_cache_tokens` of them when given, else what
    # `gpu_memory_fraction` of the GPU leaves after the weights and an activation reserve (on CPU
    # max_batch_size full sequences), capped at build and every wake by what is free then less that
    # reserve (pool.py)
    page_size: int
    kv_cache_tokens: int | None
    gpu_memory_fraction: float
    # the most prompt tokens one prefill admits (the scheduler's token budget; it also sizes the reserve)
    max_prefill_tokens: int
    # decode steps replayed as CUDA graphs, and torch.compile on the layer math (default: on for CUDA)
    cuda_graphs: bool
    compile: bool
    # "triton" (the default where CUDA has triton) or "torch": the attention kernels and the sampler
    attention: str
    sampler: str
    # tune the Triton decode kernel (splits, block_n, num_warps, num_stages; fused_rope: it rotates q and k
    # itself, default on for bf16 weights, runner.FUSED_ROPE; shared_prefix: rows decoding over the same
    # prompt pages read them once per group, triton_cascade.py, default runner.SHARED_PREFIX, never with
    # the torch attention or batch_invariant, tuned by runner.CASCADE_KEYS), and with its "prefill" entry
    # (block_m, block_n, num_warps, num_stages) the paged prefill kernel
    attn_options: dict | None
    # how a mixture-of-experts layer computes its experts (moe.py): "routed" (grouped matmuls over the
    # chosen experts only) or "dense" (every expert on every token, transformers' summation order); None:
    # "routed" where a GPU's `torch._grouped_mm` runs the model's experts, else "dense" (moe.default_moe_path)
    moe_path: str | None
    # False copies a given module's weights (fused q/k/v and gate/up) even when they could be shared
    # (None: share when dtype and device match); always False under tensor parallelism and FP8
    share_weights: bool | None
    # the config and tokenizer may run code shipped in the checkpoint (model.trust_remote_code)
    trust_remote_code: bool
    # keep a finished multi-turn session's pages, for its next turn to continue (scheduler.py)
    keep_sessions: bool
    # decode steps between the host's stop-string checks (sequence.check_finished)
    stop_check_interval: int
    # what sequences in flight do when a publication lands between two decode steps: "continue" with the
    # new weights over their K/V so far, or "restart" from their prompt (engine.py)
    on_swap: Literal["continue", "restart"]
    # the longest new prompt fed through decode steps instead of prefilled (engine.py; 0: always prefill)
    feed_prompt_tokens: int
    # tensor parallelism only, opt-in (exact on CPU and on 2x H200, 1% of a 7B TP=2 step there): a plain
    # decode step's LM head and sampling split over the ranks by vocabulary (tp_head.py)
    vocab_parallel: bool
    # how the ranks sum their partial products: "nccl" (fp32), "nccl-dtype" or "symm" (tp_comm.py); None:
    # "symm" on CUDA (1.18x shorter 7B TP=2 steps on H200s; every rank falls back to "nccl" together where
    # it cannot run), "nccl" elsewhere
    tp_allreduce: str
    # reuse the K/V of full prompt pages across requests (prefix.py)
    prefix_caching: bool
    # a request's samples independent of what else is batched (runner.py: rows run alone, torch attention
    # and sampler, no CUDA graphs or compile; not with tensor parallelism)
    batch_invariant: bool
    # "fp8": the layers' linear weights held in FP8, quantised as they arrive (fp8.py); "none"
    quantization: str
    # every request is one action of this continuous action head (action.py; not with tensor parallelism)
    action_head: ActionHeadSpec | None

    @property
    def fp8(self) -> bool:
        return self.quantization == "fp8"


def engine_options(args: Mapping[str, Any]) -> EngineOptions:
    """`build_fast_engine`'s arguments by name -> its options: checked, ASCENT_FAST_ENGINE's overrides
    applied, the device's defaults picked."""
    tp_size = tp_ranks(args["tensor_parallel"])
    on_swap = check_options(args, tp_size)
    picked = debug_overrides({k: args[k] for k in DEBUG_KEYS})
    if args["batch_invariant"]:
        picked |= BATCH_INVARIANT
    dev = resolve_device(args["device"])
    dtype = compute_dtype(args["dtype"], dev)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    fp8 = args["quantization"] == "fp8"
    if fp8:
        check_fp8_device(dev)
    on_cuda = dev.type == "cuda"
    kernels = "triton" if on_cuda and _has_triton() else "torch"
    return EngineOptions(
        device=dev,
        dtype=dtype,
        max_batch_size=args["max_batch_size"],
        max_model_len=args["max_model_len"],
        page_size=args["page_size"],
        kv_cache_tokens=args["kv_cache_tokens"],
        gpu_memory_fraction=args["gpu_memory_fraction"],
        max_prefill_tokens=args["max_prefill_tokens"],
        cuda_graphs=on_cuda if picked["cuda_graphs"] is None else picked["cuda_graphs"],
        compile=on_cuda if picked["compile"] is None else picked["compile"],
        attention=picked["attention"] or kernels,
        sampler=picked["sampler"] or kernels,
        attn_options=args["attn_options"],
        moe_path=picked["moe_path"],
        # a shard is a copy, and FP8 weights are the engine's own: never the trainer's tensors
        share_weights=False if tp_size > 1 or fp8 else args["share_weights"],
        trust_remote_code=args["trust_remote_code"],
        keep_sessions=args["keep_sessions"],
        stop_check_interval=args["stop_check_interval"],
        on_swap=on_swap,
        feed_prompt_tokens=args["feed_prompt_tokens"],
        vocab_parallel=bool(picked["vocab_parallel"]),
        tp_allreduce=picked["tp_allreduce"] or ("symm" if on_cuda else "nccl"),
        prefix_caching=args["prefix_caching"],
        batch_invariant=args["batch_invariant"],
        quantization=args["quantization"],
        action_head=args["action_head"],
    )


def tp_ranks(tensor_parallel: TPGroup | int | None) -> int:
    """How many ranks the replica spans: a group's size, or the number asked (None or 0: one)."""
    return tensor_parallel.size if isinstance(tensor_parallel, TPGroup) else tensor_parallel or 1


def check_options(args: Mapping[str, Any], tp_size: int) -> Literal["continue", "restart"]:
    """Refuse the option values and combinations the engine cannot run, before anything is loaded or any
    rank started. -> `on_swap`, checked."""
    quantization = args["quantization"]
    if quantization not in QUANTIZATIONS:
        raise Fp8Error(f"rollout.quantization={quantization!r}: use one of {list(QUANTIZATIONS)}.")
    if args["batch_invariant"] and tp_size > 1:
        raise ValueError(
            f"batch_invariant=True with tensor_parallel={tp_size}: the batch-invariant mode runs a replica "
            "on one GPU; set rollout.tensor_parallel=1 or rollout.batch_invariant=false."
        )
    if args["action_head"] is not None and tp_size > 1:
        raise ValueError(
            f"model.action_head with rollout.tensor_parallel={tp_size}: the fast engine's action head runs "
            "on one GPU; set rollout.tensor_parallel=1."
        )
    if args["tp_allreduce"] is not None:
        check_allreduce(args["tp_allreduce"])
    if args["moe_path"] is not None:
        experts_path(args["moe_path"])  # refuses an unknown path
    return _on_swap(args["on_swap"])


def debug_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """ASCENT_FAST_ENGINE='{"cuda_graphs": false, "compile": false, "attention": "torch", "sampler": "torch",
    "moe_path": "dense", "vocab_parallel": false, "tp_allreduce": "nccl"}' switches engine parts off (or
    picks them) for a whole run, to locate a problem (BENCHMARKS.md, logprob agreement): `values` (by the
    names of DEBUG_KEYS) with the environment's picks over them."""
    picks = json.loads(os.environ.get("ASCENT_FAST_ENGINE", "{}"))
    return {k: picks.get(k, v) for k, v in values.items()}


def _on_swap(value: str) -> Literal["continue", "restart"]:
    if value == "continue":
        return "continue"
    if value == "restart":
        return "restart"
    raise ValueError(f"on_swap={value!r}: use 'continue' or 'restart'.")


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
