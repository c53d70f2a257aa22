"""`engine_options` (ascent/rollout/fast/options.py): build_fast_engine's arguments -> EngineOptions, checked
and resolved before anything is loaded (no model here: every case runs in milliseconds)."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import fields

import pytest
import torch

from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.fp8 import Fp8Error
from ascent.rollout.fast.options import EngineOptions, engine_options

PARAMS = inspect.signature(build_fast_engine).parameters


def _args(**given):
    """build_fast_engine's arguments by name, its defaults on the CPU in fp32 under `given`."""
    defaults = {n: p.default for n, p in PARAMS.items() if p.kind is not p.VAR_KEYWORD}
    return defaults | {"device": "cpu", "dtype": "fp32"} | given


def test_every_argument_is_an_option_field_or_named_in_the_docstring() -> None:
    options = {f.name for f in fields(EngineOptions)}
    doc = build_fast_engine.__doc__ or ""
    inputs = [n for n in PARAMS if n not in options]
    assert options <= set(PARAMS)  # each option is an argument of the builder
    assert [n for n in inputs if f"`{n}`" not in doc] == []


def test_cpu_defaults() -> None:
    o = engine_options(_args())
    assert (o.device, o.dtype) == (torch.device("cpu"), torch.float32)
    assert (o.cuda_graphs, o.compile, o.attention, o.sampler) == (False, False, "torch", "torch")
    assert (o.moe_path, o.vocab_parallel, o.share_weights, o.on_swap) == (None, False, None, "continue")
    assert not o.fp8 and not o.fused_gemm


def test_fused_gemm_default_and_override(monkeypatch) -> None:
    """Off on CPU, asked for through ASCENT_FAST_ENGINE; never under FP8, tensor parallelism or the
    batch-invariant mode (tiles follow the batch size)."""
    assert engine_options(_args(dtype="bf16")).fused_gemm is False
    monkeypatch.setenv("ASCENT_FAST_ENGINE", json.dumps({"fused_gemm": True}))
    assert engine_options(_args(dtype="bf16")).fused_gemm is True
    assert engine_options(_args(dtype="bf16", fused_gemm=False)).fused_gemm is True  # the override wins
    assert engine_options(_args(tensor_parallel=2)).fused_gemm is False
    assert engine_options(_args(quantization="fp8")).fused_gemm is False
    assert engine_options(_args(batch_invariant=True)).fused_gemm is False
    monkeypatch.delenv("ASCENT_FAST_ENGINE")
    assert engine_options(_args(dtype="bf16", fused_gemm=True)).fused_gemm is True


def test_fused_gemm_defaults_on_for_half_precision_triton_on_cuda(monkeypatch) -> None:
    """The CUDA default, resolved without a GPU: on for bf16/fp16 with Triton attention, off for fp32,
    torch attention and FP8."""
    from ascent.rollout.fast import options

    monkeypatch.setattr(options, "resolve_device", lambda _: torch.device("cuda", 0))
    monkeypatch.setattr(options, "compute_dtype", lambda name, _: getattr(torch, name))
    monkeypatch.setattr(options, "check_fp8_device", lambda _: None)
    monkeypatch.setattr(options, "_has_triton", lambda: True)
    assert engine_options(_args(dtype="bfloat16")).fused_gemm is True
    assert engine_options(_args(dtype="float16")).fused_gemm is True
    assert engine_options(_args(dtype="float32")).fused_gemm is False
    assert engine_options(_args(dtype="bfloat16", attention="torch")).fused_gemm is False
    assert engine_options(_args(dtype="bfloat16", quantization="fp8")).fused_gemm is False
    monkeypatch.setattr(options, "_has_triton", lambda: False)
    assert engine_options(_args(dtype="bfloat16")).fused_gemm is False


def test_debug_overrides_pick_over_arguments_and_batch_invariance_over_both(monkeypatch) -> None:
    picks = {"cuda_graphs": True, "attention": "triton", "moe_path": "dense", "vocab_parallel": 1}
    monkeypatch.setenv("ASCENT_FAST_ENGINE", json.dumps(picks))
    o = engine_options(_args(moe_path="routed", attention="torch"))
    assert (o.cuda_graphs, o.attention, o.moe_path, o.vocab_parallel) == (True, "triton", "dense", True)
    o = engine_options(_args(batch_invariant=True))
    assert (o.cuda_graphs, o.compile, o.attention, o.sampler) == (False, False, "torch", "torch")


def test_tensor_parallel_never_shares_weights() -> None:
    assert engine_options(_args(tensor_parallel=2, share_weights=True)).share_weights is False
    assert engine_options(_args(tensor_parallel=1, share_weights=True)).share_weights is True


@pytest.mark.parametrize(
    ("given", "error", "names"),
    [
        ({"quantization": "int4"}, Fp8Error, "rollout.quantization='int4'"),
        ({"tensor_parallel": 2, "batch_invariant": True}, ValueError, "rollout.batch_invariant=false"),
        ({"tp_allreduce": "nvls"}, ValueError, "tp_allreduce='nvls'"),
        ({"moe_path": "sparse"}, ValueError, "moe_path='sparse'"),
        ({"on_swap": "later"}, ValueError, "on_swap='later'"),
    ],
)
def test_refusals_name_the_setting(given, error, names) -> None:
    with pytest.raises(error, match=re.escape(names)):
        engine_options(_args(**given))
