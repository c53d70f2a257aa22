"""A reward for tests that must catch a run mid-flight: exact match, after sleeping SLOW_REWARD_S seconds
(unset: no sleep), so the same config runs fast when the test does not need it slow."""

from __future__ import annotations

import os
import time
from typing import Any

from ascent.rewards.builtin import exact_match


def score(prompt: str, response: str, response_ids: list[int], metadata: dict[str, Any]) -> float:
    time.sleep(float(os.environ.get("SLOW_REWARD_S", "0")))
    return exact_match(prompt, response, response_ids, metadata)
