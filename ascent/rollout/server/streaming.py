"""Streaming plumbing (`ascent.rollout.server`): tokens from the engine thread to a handler, text to SSE.

`TokenFeed` carries one request's tokens from the batcher thread into the event loop (an asyncio queue fed
with `call_soon_threadsafe`), then its final result. `TextStream` turns a sample's tokens into text deltas:
it decodes the ids so far (so multi-byte characters split across tokens come out whole), holds back the
last characters that could start a stop string, and ends the text before the first stop string, as the
OpenAI API leaves stop strings out. `sse` writes chunks as server-sent events ending with `[DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from typing import Any

from ascent.rollout.server.batcher import BatchResult
from ascent.rollout.server.chat import cut_at_stop

TokenEvent = tuple[int, int, float]  # (sample index, token id, logprob)


class TokenFeed:
    """The tokens of one or more requests, handed from the batcher thread to the event loop that made the
    feed. Each request's sample indices are shifted by the offset given to `callback`."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[TokenEvent | None] = asyncio.Queue()
        self.futures: list[Future[BatchResult]] = []

    def _put(self, item: TokenEvent | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the server is stopping
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def callback(self, offset: int = 0) -> Callable[[int, int, float], None]:
        """The `on_token` for a request whose samples are choices offset, offset + 1, ..."""
        return lambda index, token_id, logprob: self._put((offset + index, token_id, logprob))

    def attach(self, future: Future[BatchResult]) -> None:
        """A request's future from the batcher; `events()` ends once every attached one is done."""
        self.futures.append(future)
        future.add_done_callback(lambda _: self._put(None))

    async def events(self) -> AsyncIterator[TokenEvent]:
        left = len(self.futures)
        while left:
            item = await self.queue.get()
            if item is None:
                left -= 1
            else:
                yield item


class TextStream:
    """A sample's text, delta by delta, with stop strings held back and cut off."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self.decode, self.stops = decode, tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False

    @property
    def text(self) -> str:
        return cut_at_stop(self.decode(self.ids), self.stops)[0]

    def push(self, token_id: int) -> str:
        """Add a token; return the text that is now safe to send."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        full = self.decode(self.ids)
        text, self.stopped = cut_at_stop(full, self.stops)
        if self.stopped:
            return self._take(text, len(text))
        if text.endswith("\ufffd"):  # a character split across tokens: wait for the rest
            return ""
        return self._take(text, len(text) - self.hold)

    def finish(self) -> str:
        """The rest of the text, once the sample has ended."""
        return self._take(self.text, None)

    def _take(self, text: str, upto: int | None) -> str:
        end = len(text) if upto is None else upto
        if end <= self.sent:
            return ""
        delta = text[self.sent : end]
        self.sent = end
        return delta


async def sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """Server-sent events: one `data:` line per chunk, then `data: [DONE]`."""
    async for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
