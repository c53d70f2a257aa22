"""A reward for the divergence test: the parity of the first sampled token, so an untrained tiny model gets
mixed rewards in every group (nonzero advantages, a real gradient) without learning anything first."""

from __future__ import annotations

from typing import Any


def first_token_parity(
    prompt: str, response: str, response_ids: list[int], metadata: dict[str, Any]
) -> float:
    return float(bool(response_ids) and response_ids[0] % 2 == 0)
