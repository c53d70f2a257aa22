"""Shared fixtures of the trainer tests: one tiny Qwen2 checkpoint per session (helpers:
trainer_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from ascent.models.tiny import make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """A tiny Qwen2 checkpoint (char tokenizer) on disk, shared by every trainer test."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture()
def tiny_model(tiny_path):
    """A fresh fp32 copy of the tiny model in eval mode (SDPA attention)."""
    from ascent.models import load_model

    torch.manual_seed(0)
    return load_model(tiny_path, dtype="fp32", device="cpu")
