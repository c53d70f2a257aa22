"""A tiny checkpoint shared by the doctor's tests (no network: `ascent.models.tiny`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from ascent.models.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("doctor") / "tiny", hidden_size=32, num_layers=2, seed=0
    )


@pytest.fixture
def tiny_copy(tiny_dir, tmp_path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(tiny_dir, out)
    return out
