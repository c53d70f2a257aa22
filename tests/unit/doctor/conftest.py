"""A tiny checkpoint and a few prompt rows shared by the doctor's tests (no network: `ascent.models.tiny`)."""

from __future__ import annotations

import json
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


@pytest.fixture(scope="session")
def rows_file(tmp_path_factory) -> Path:
    """Three single-turn rows with a prompt and an answer (what exact_match reads)."""
    path = tmp_path_factory.mktemp("doctor_data") / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(3)))
    return path
