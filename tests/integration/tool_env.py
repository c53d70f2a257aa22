"""An environment whose tool the tiny model calls by chance, for the group-hook test: with one-character
turns, a turn holding a digit calls the probe tool (answered "ok", `info["tool_calls"]` 1); any other turn
ends the episode, rewarded 1 when the episode called the tool."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ascent.envs import StepResult


class ToolProbe:
    def reset(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        self.calls = 0
        return [{"role": "user", "content": "go"}]

    def step(self, action: str) -> StepResult:
        if any(c.isdigit() for c in action):
            self.calls += 1
            return StepResult(({"role": "tool", "content": "ok"},), info={"tool_calls": 1})
        return StepResult(reward=float(self.calls > 0), done=True)
