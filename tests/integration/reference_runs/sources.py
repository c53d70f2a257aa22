"""The user code of the reference runs: a reward function, an environment and an agent whose rewards are dense
on an untrained tiny model (a share of characters, not a right answer), so every iteration has nonzero
advantages and moves the weights; the reference then pins those moves."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import openai

from ascent.envs import StepResult

DIGITS = set("0123456789")


def digit_share(text: str) -> float:
    """The share of `text`'s characters that are digits (0 for an empty text)."""
    return sum(c in DIGITS for c in text) / len(text) if text else 0.0


def score(prompt: str, response: str, response_ids: list[int], metadata: dict[str, Any]) -> float:
    """The reward function (`reward.fn`): the response's share of digits. It sleeps REFERENCE_RUNS_SLOW_S
    seconds first where that is set (the resume run, to be killed before it ends)."""
    time.sleep(float(os.environ.get("REFERENCE_RUNS_SLOW_S", "0")))
    return digit_share(response)


class Digits:
    """Two turns: the model answers, the environment replies `again`, the model answers once more; the reward
    is the mean digit share of the two answers."""

    def reset(self, row: Mapping[str, Any]) -> list[dict[str, str]]:
        self.shares: list[float] = []
        return [{"role": "user", "content": f"say {row['answer']}"}]

    def step(self, action: str) -> StepResult:
        self.shares.append(digit_share(action))
        if len(self.shares) < 2:
            return StepResult(({"role": "user", "content": "again"},))
        return StepResult(reward=sum(self.shares) / 2, done=True)


async def agent(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
    """The same game through the OpenAI client: two calls, the mean digit share of the two replies."""
    messages: list[Any] = [{"role": "user", "content": f"say {row['answer']}"}]
    shares = []
    for _ in range(2):
        reply = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
        text = reply.choices[0].message.content or ""
        shares.append(digit_share(text))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    return sum(shares) / 2
