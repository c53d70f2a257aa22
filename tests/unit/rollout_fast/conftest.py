"""Fixtures for the fast engine's CPU tests: the tiny Qwen2 checkpoint with a sharpened head, and engines."""

from __future__ import annotations

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
