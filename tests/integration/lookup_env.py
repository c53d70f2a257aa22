"""A two-turn environment for the multi-turn learning test: the answer is a secret digit the prompt does not
show, so the model cannot know it in its head; asking (`?`) makes the environment reveal it as a tool message,
and repeating it earns 1. Answering at once is a 1-in-10 guess."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ascent.envs import StepResult


class Lookup:
    def reset(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        self.secret, self.asked = str(row["secret"]), False
        return [{"role": "user", "content": "key"}]

    def step(self, action: str) -> StepResult:
        text = action.strip()
        if text == "?" and not self.asked:
            self.asked = True
            return StepResult(({"role": "tool", "content": self.secret},))
        return StepResult(reward=float(text == self.secret), done=True)
