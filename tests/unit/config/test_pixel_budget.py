"""model.min_pixels / model.max_pixels: unset by default (the checkpoint's budget); an inverted budget is
refused naming both fields."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ascent.config.schema import ModelConfig


def test_pixel_budget_defaults_and_order():
    assert ModelConfig().min_pixels is None and ModelConfig().max_pixels is None
    assert ModelConfig(min_pixels=3136, max_pixels=3136 * 16).max_pixels == 3136 * 16
    with pytest.raises(ValidationError, match="model.min_pixels=5000 is over model.max_pixels=4000"):
        ModelConfig(min_pixels=5000, max_pixels=4000)
