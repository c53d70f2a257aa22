"""Fixtures for the fast engine's CPU tests: the tiny Qwen2 checkpoint with a sharpened head, engines, and
two fixes to the Triton interpreter's bf16 (rounding, `tl.dot`) for the kernel tests run under it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ascent.models import make_tiny_checkpoint
from ascent.rollout import build_engine
from ascent.rollout.fast import build_fast_engine

HEAD_SCALE = 10.0  # random init is near-uniform; a sharper head gives varied, peaked outputs


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread is 4x faster than two on a busy 2-core machine (no barrier waits)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def fast_tiny_path(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_fast"), tie_word_embeddings=False, seed=1)


@pytest.fixture
def engines(fast_tiny_path):
    """-> make(**fast_kw) returning (reference engine, fast engine) with the same sharpened weights."""

    def make(**kw):
        ref = build_engine("reference", model_path=fast_tiny_path, device="cpu")
        head = ref.model.get_output_embeddings().weight.detach() * HEAD_SCALE
        ref.update_weights([("lm_head.weight", head)])
        kw.setdefault("max_model_len", 160)
        fast = build_fast_engine(model_path=fast_tiny_path, dtype="fp32", device="cpu", page_size=16, **kw)
        fast.update_weights([("lm_head.weight", head)])
        return ref, fast

    return make


@pytest.fixture
def rtne_bf16(monkeypatch):
    """The interpreter rounds fp32 -> bf16 toward zero (triton 3.6 `cast_impl`); compiled Triton rounds to
    nearest even (cvt.rn), as torch does: make the interpreter round as torch, so bf16 results compare."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    cast = InterpreterBuilder.cast_impl

    def cast_rtne(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bf16 = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return TensorHandle(bf16.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    monkeypatch.setattr(InterpreterBuilder, "cast_impl", cast_rtne)


@pytest.fixture
def bf16_dot(monkeypatch):
    """The interpreter's `tl.dot` multiplies bf16 operands as their raw 16-bit patterns (numpy has no
    bf16): widen them to fp32 first, as the tensor cores do, so a bf16 kernel computes attention."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    dot = InterpreterBuilder.create_dot

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        wide = (x.data.astype(np.uint32) << 16).view(np.float32)
        return TensorHandle(wide, tl.float32)

    def dot_fp32(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(InterpreterBuilder, "create_dot", dot_fp32)
