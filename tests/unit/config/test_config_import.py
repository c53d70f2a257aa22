"""`ascent.config` and the CLI start without torch (fast `ascent --help`, `ascent config show`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("module", ["ascent.config", "ascent.cli", "ascent.errors"])
def test_imports_without_torch(module: str) -> None:
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch was imported'"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
