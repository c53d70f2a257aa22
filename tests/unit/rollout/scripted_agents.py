"""Agents for the tests of `ascent.envs.openai_agents`: well-behaved ones (one makes calls in parallel), ones
that raise, hang, block their event loop, return nonsense or kill their process, and ones whose
conversation outgrows the endpoint's context (raising on its 400, or catching it)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any


async def polite(client: Any, row: dict[str, Any]) -> float:
    out = await client.chat.completions.create(model="any", messages=[{"role": "user", "content": row["q"]}])
    return float(len(out.choices[0].message.content or "") > 0) + row.get("bonus", 0)


async def in_parallel(client: Any, row: dict[str, Any]) -> float:
    """Asks once, then asks two follow-ups at once (`long` first, `short` a moment later), then goes on from
    the `long` one's reply."""

    async def ask(messages: list[dict[str, str]], wait_s: float = 0.0) -> list[dict[str, str]]:
        await asyncio.sleep(wait_s)
        out = await client.chat.completions.create(model="any", messages=messages)
        return [*messages, {"role": "assistant", "content": out.choices[0].message.content or ""}]

    first = await ask([{"role": "user", "content": row["q"]}])
    long, _ = await asyncio.gather(
        ask([*first, {"role": "user", "content": "long"}]),
        ask([*first, {"role": "user", "content": "short"}], wait_s=0.1),
    )
    await ask([*long, {"role": "user", "content": "go on"}])
    return 1.0


def plain(client: Any, row: dict[str, Any]) -> None:
    client.chat.completions.create(model="any", messages=[{"role": "user", "content": row["q"]}])


async def raises(client: Any, row: dict[str, Any]) -> float:
    raise ValueError(f"no answer for {row['q']}")


async def hangs(client: Any, row: dict[str, Any]) -> float:
    await asyncio.sleep(3600)
    return 1.0


async def nonsense(client: Any, row: dict[str, Any]) -> Any:
    return "yes"


async def dies(client: Any, row: dict[str, Any]) -> float:
    os._exit(3)


async def blocks(client: Any, row: dict[str, Any]) -> float:
    time.sleep(3600)  # never yields: the watchdog interrupts it (the process timeout is the backstop)
    return 1.0


async def blocks_on_b(client: Any, row: dict[str, Any]) -> float:
    """`polite`, except that the episode of row q="b" blocks its event loop for an hour, once the others
    (of the same loop) have had a second to finish."""
    if row["q"] == "b":
        await asyncio.sleep(1.0)
        time.sleep(3600)
    return await polite(client, row)


async def _talk_on(client: Any, row: dict[str, Any]) -> None:
    """Ask, then echo the reply and ask again, until the endpoint refuses (the 400 raises)."""
    messages = [{"role": "user", "content": row["q"]}]
    for _ in range(100):
        out = await client.chat.completions.create(model="any", messages=messages, max_tokens=4)
        messages += [
            {"role": "assistant", "content": out.choices[0].message.content or ""},
            {"role": "user", "content": "more"},
        ]


async def talks_on(client: Any, row: dict[str, Any]) -> float:
    await _talk_on(client, row)
    return 1.0


async def talks_on_then_scores(client: Any, row: dict[str, Any]) -> float:
    """Catches the endpoint's context_length_exceeded, as a careful agent does, and returns a reward."""
    import openai

    try:
        await _talk_on(client, row)
    except openai.BadRequestError as err:
        assert err.code == "context_length_exceeded"
    return 0.25


def plain_talks_on(client: Any, row: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": row["q"]}]
    for _ in range(100):
        out = client.chat.completions.create(model="any", messages=messages, max_tokens=4)
        messages += [
            {"role": "assistant", "content": out.choices[0].message.content or ""},
            {"role": "user", "content": "more"},
        ]


def plain_hangs(client: Any, row: dict[str, Any]) -> None:
    time.sleep(3600)  # on its own thread: the episode times out and the process goes on


NOT_A_FUNCTION = 3
