"""Shared fixtures for the data tests: the tiny character tokenizer (with and without a chat template)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from ascent.models.tiny import make_char_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("char_tokenizer")
    make_char_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture
def plain_tokenizer(tokenizer_dir):
    """The same tokenizer without a chat template."""
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.chat_template = None
    return tok
