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
    assert not o.fp8


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
