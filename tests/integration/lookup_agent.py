"""The lookup game of `lookup_env.py`, written as an agent that knows only the OpenAI client: ask the model,
and when it asks back (`?`), answer with the secret as a tool message and ask again; repeating the secret
earns 1. `guess_once` never shows the secret (the reward function scores its single reply); `talks_on`
outgrows the run's context; `always_fails` raises."""

from __future__ import annotations

from typing import Any

import openai


async def run(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
    messages: list[Any] = [{"role": "user", "content": "key"}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
        text = reply.choices[0].message.content or ""
        if text.strip() != "?" or len(messages) > 1:
            return float(text.strip() == str(row["secret"]))
        messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": str(row["secret"])}]
    return 0.0


def guess_once(client: openai.OpenAI, row: dict[str, Any]) -> None:
    client.chat.completions.create(model="anything", messages=[{"role": "user", "content": "key"}])


async def always_fails(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
    await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "key"}])
    raise RuntimeError("the agent's own bug")


async def talks_on(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
    """Keeps the conversation going until the endpoint refuses a call past the run's context (and raises)."""
    messages: list[Any] = [{"role": "user", "content": "key"}]
    while True:
        reply = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": "more"},
        ]
