"""Shared fixtures for rollout tests: a tiny untied Qwen2 checkpoint with a sharpened output head."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ascent.models import make_tiny_checkpoint
from ascent.rollout import ReferenceEngine, build_engine

HEAD_SCALE = 10.0  # random init is near-uniform over the vocab; a sharper head gives varied, peaked outputs


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_rollout"), tie_word_embeddings=False, seed=1)


@pytest.fixture
def make_engine(tiny_path: Path) -> Callable[..., ReferenceEngine]:
    def make(**kwargs: object) -> ReferenceEngine:
        engine = build_engine("reference", model_path=tiny_path, device="cpu", **kwargs)
        assert isinstance(engine, ReferenceEngine)
        head = engine.model.get_output_embeddings().weight
        engine.update_weights([("lm_head.weight", head.detach() * HEAD_SCALE)])
        return engine

    return make


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose tokenizer has Qwen's `<tool_call>` words and braces (for the HTTP server)."""
    from ascent.models.tiny import DEFAULT_CHARS

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny_chat") / "tiny-chat",
        hidden_size=32,
        words=["<tool_call>", "</tool_call>"],
        chars=DEFAULT_CHARS + "{}",
        seed=2,
    )
