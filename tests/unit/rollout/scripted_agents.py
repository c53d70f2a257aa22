"""Agents for the tests of `ascent.envs.openai_agents`: well-behaved ones (one makes calls in parallel), and
ones that raise, hang, block their event loop, return nonsense or kill their process."""

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
    long, _ = await asyncio.gather(ask([*first, {"role": "user", "content": "long"}]),
                                   ask([*first, {"role": "user", "content": "short"}], wait_s=0.1))  # fmt: skip
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
    time.sleep(3600)  # never yields: only the process timeout ends it
    return 1.0


NOT_A_FUNCTION = 3
