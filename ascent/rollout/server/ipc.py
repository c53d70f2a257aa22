"""The wire between the HTTP front-end processes and the engine process (`ascent.rollout.server`).

One unix-socket stream per front-end process (asyncio streams on both ends), carrying frames: a 4-byte
length, then a msgpack array of messages, each an array `[kind, request id, ...]`. Only token ids,
sampling params, a request's encoded images (float32 patches as bytes), logprobs, forced flags, finish
reasons and conversation digests cross it; all text and image decoding work stays in the front ends. `Channel.post` may be called from any thread (the engine's batcher thread posts tokens and
results): messages queue up and are written together once per event-loop turn, so a busy engine costs one
write per turn, not one per token. The codecs below turn the messages' dataclasses into plain arrays and back.

Messages, front end -> engine: `hello pid`, `submit id session endpoint completion_id first_index stream
request`, `cancel id`, `match id session digests last_assistant`, `remember id session length digest ids`,
`health id`. Engine -> front end: `queued id` (a stream's request was accepted), `token id index token
logprob`, `result id policy_version generations`, `error id api_error`, `reply id value`.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

import msgpack
import numpy as np

from ascent.messages import Generation, GenerationRequest, ImageInput, SamplingParams
from ascent.rollout.server.errors import APIError

_HEADER = struct.Struct("!I")
MAX_BUFFERED = 256 << 20  # bytes waiting for a peer that does not read: past it the connection is dropped


class Channel:
    """One end of a connection; see the module docstring. Made on the event loop that reads and writes it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._out: list[Any] = []
        self._scheduled = False
        self.closed = False

    def post(self, message: list[Any]) -> None:
        """Queue `message` for the peer (any thread); dropped once the channel is closed."""
        if self.closed:
            return
        self._out.append(message)
        if self._scheduled:
            return
        self._scheduled = True
        if threading.get_ident() == self._loop_thread:
            self.loop.call_soon(self._flush)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: so is the channel
                self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        self._scheduled = False  # before taking the queue: a post racing with us schedules another flush
        items, self._out = self._out, []
        if not items or self.closed:
            return
        data = msgpack.packb(items, use_bin_type=True, default=_plain)
        self.writer.writelines([_HEADER.pack(len(data)), data])
        if self.writer.transport.get_write_buffer_size() > MAX_BUFFERED:
            self.close()  # the peer stopped reading: never let it grow this process without bound

    async def messages(self) -> AsyncIterator[list[Any]]:
        """The peer's messages, in order, until it closes the connection (or dies)."""
        try:
            while True:
                (size,) = _HEADER.unpack(await self.reader.readexactly(_HEADER.size))
                for message in msgpack.unpackb(await self.reader.readexactly(size), raw=False):
                    yield message
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            self.writer.close()


def _plain(value: Any) -> Any:
    """numpy and torch scalars as Python numbers (msgpack's hook for types it does not know)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot send a {type(value).__name__} to the other process")


# ---- codecs ------------------------------------------------------------------------------------------------


def request_to_wire(request: GenerationRequest) -> list[Any]:
    return [request.prompt_ids, asdict(request.params), [image_to_wire(im) for im in request.images]]


def request_from_wire(wire: list[Any]) -> GenerationRequest:
    ids, params, images = wire
    params["stop_token_ids"] = tuple(params["stop_token_ids"])
    params["stop_strings"] = tuple(params["stop_strings"])
    return GenerationRequest(ids, SamplingParams(**params), images=tuple(image_from_wire(w) for w in images))


def image_to_wire(image: ImageInput) -> list[Any]:
    pixels = np.ascontiguousarray(np.asarray(image.pixel_values, dtype=np.float32))
    return [
        pixels.tobytes(),
        list(pixels.shape),
        list(image.grid_thw),
        image.num_tokens,
        image.digest,
        image.source,
    ]


def image_from_wire(wire: list[Any]) -> ImageInput:
    data, shape, grid, num_tokens, digest, source = wire
    pixels = np.frombuffer(data, dtype=np.float32).reshape(shape).copy()
    return ImageInput(pixels, (grid[0], grid[1], grid[2]), num_tokens, digest, source)


def generation_to_wire(gen: Generation) -> list[Any]:
    return [gen.token_ids, gen.logprobs, gen.finish_reason, gen.token_versions, gen.cached_tokens, gen.forced]


def generation_from_wire(wire: list[Any]) -> Generation:
    ids, logprobs, finish, versions, cached, forced = wire
    return Generation(ids, logprobs, finish, versions, cached, forced=forced)


def error_to_wire(err: APIError) -> list[Any]:
    return [err.status, err.message, err.param, err.code, err.kind, err.headers]


def error_from_wire(wire: list[Any]) -> APIError:
    status, message, param, code, kind, headers = wire
    return APIError(status, message, param=param, code=code, kind=kind, headers=headers)
