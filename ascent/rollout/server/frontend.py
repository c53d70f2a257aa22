"""A front-end process of `--api-processes N` (`ascent.rollout.server`): HTTP in, token ids to the engine.

`run_frontend` is the process's body (started by `pool.FrontendPool` with the `spawn` method, so it inherits
no threads or CUDA state of the engine's process): uvicorn serves the FastAPI app (`app.py`, the same routes
and handlers as the one-process server) on its own socket listening on the server's port with SO_REUSEPORT
(the kernel spreads connections over the front ends, `reuse_port_socket`), and
`RemoteFront` carries each engine request to the engine process over one `ipc.Channel`, matching answers to
requests by id. All host work of a request (parse, validate, chat template, tokenize, detokenize, JSON, SSE)
happens here. The process leaves when its engine goes away (the connection closes) or on SIGTERM, after
uvicorn's graceful shutdown; it is in its own process group, so a Ctrl-C in the terminal reaches only the
engine's process, which then stops its front ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import traceback
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ascent.messages import GenerationRequest
from ascent.models.vision import ImageCodec
from ascent.rollout.server.app import build_app
from ascent.rollout.server.batcher import BatchResult, TokenCallback
from ascent.rollout.server.errors import APIError
from ascent.rollout.server.front import Front, unavailable
from ascent.rollout.server.ipc import Channel, error_from_wire, generation_from_wire, request_to_wire
from ascent.rollout.server.options import ServerOptions, uvicorn_config
from ascent.rollout.server.recorder import Endpoint

# the longest wait for an engine answer that comes at once (a stream's acceptance: beyond pause_timeout_s)
RPC_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FrontendSpec:
    """What a front-end process needs: where the engine listens, the server's options, tokenizer and image
    codec (None: a text model)."""

    hub_path: str
    options: ServerOptions
    tokenizer: Any
    host: str
    port: int
    log_level: str
    codec: ImageCodec | None = None


@dataclass
class _Call:
    """A request in the engine: its future, its stream callback, the tokens of each sample streamed so far."""

    future: Future[BatchResult]
    on_token: TokenCallback | None
    accepted: asyncio.Future[None] | None
    streamed: dict[int, int] = field(default_factory=dict)


class RemoteFront(Front):
    """`Front` over the channel to the engine process (see the module docstring)."""

    def __init__(self, spec: FrontendSpec) -> None:
        super().__init__(spec.tokenizer, spec.options, spec.codec)
        self.hub_path = spec.hub_path
        self.channel: Channel | None = None
        self.server: Any = None  # the uvicorn.Server, told to exit when the engine goes away
        self._ids = itertools.count()
        self._calls: dict[int, _Call] = {}
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._gone = False

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Connect to the engine before uvicorn accepts a request; read its answers while serving."""
        reader, writer = await asyncio.open_unix_connection(self.hub_path)
        self.channel = Channel(reader, writer)
        reading = asyncio.create_task(self._read(self.channel))
        greeting = asyncio.create_task(self._hello(self.channel))
        try:
            yield
        finally:
            reading.cancel()
            greeting.cancel()
            self.channel.close()

    async def _hello(self, channel: Channel) -> None:
        """Tell the engine this process serves, once uvicorn listens (after the lifespan's startup)."""
        while self.server is not None and not self.server.started:
            await asyncio.sleep(0.01)
        channel.post(["hello", os.getpid()])

    # ---- Front -------------------------------------------------------------------------------------------

    async def submit(
        self,
        request: GenerationRequest,
        session: str,
        endpoint: Endpoint,
        completion_id: str,
        on_token: TokenCallback | None = None,
        first_index: int = 0,
    ) -> Future[BatchResult]:
        channel = self._channel()
        rid = next(self._ids)
        stream = on_token is not None
        call = _Call(Future(), on_token, asyncio.get_running_loop().create_future() if stream else None)
        self._calls[rid] = call
        call.future.add_done_callback(lambda f: self._cancel(rid) if f.cancelled() else None)
        channel.post(
            ["submit", rid, session, endpoint, completion_id, first_index, stream, request_to_wire(request)]
        )
        if call.accepted is not None:  # a stream: a refusal (503) must come before its 200 does
            timeout_s = self.options.pause_timeout_s + RPC_TIMEOUT_S  # the engine may wait out an update
            try:
                await asyncio.wait_for(call.accepted, timeout_s)
            except TimeoutError:
                call.future.cancel()  # forgets the call and tells the engine
                raise self._no_answer("accept a streamed request", timeout_s) from None
        return call.future

    async def health(self) -> dict[str, Any]:
        return dict(await self._rpc("health"))

    async def _match(
        self, session: str, digests: list[bytes], assistant_at: int
    ) -> tuple[int, list[int]] | None:
        found = await self._rpc("match", session, digests, assistant_at)
        return None if found is None else (int(found[0]), list(found[1]))

    async def _remember(self, session: str, length: int, digest: bytes, ids: list[int]) -> None:
        await self._rpc("remember", session, length, digest, ids)

    # ---- the channel -------------------------------------------------------------------------------------

    def _channel(self) -> Channel:
        if self.channel is None or self.channel.closed or self._gone:
            raise unavailable("the engine process is gone", self.options.retry_after_s)
        return self.channel

    async def _rpc(self, kind: str, *args: Any) -> Any:
        channel = self._channel()
        rid = next(self._ids)
        reply = self._replies[rid] = asyncio.get_running_loop().create_future()
        channel.post([kind, rid, *args])
        try:
            return await asyncio.wait_for(reply, RPC_TIMEOUT_S)
        except TimeoutError:
            self._replies.pop(rid, None)
            raise self._no_answer(f"answer a {kind!r} call", RPC_TIMEOUT_S) from None

    def _no_answer(self, what: str, timeout_s: float) -> APIError:
        return unavailable(
            f"the engine process did not {what} within {timeout_s:g} s", self.options.retry_after_s
        )

    def _cancel(self, rid: int) -> None:
        """The handler stopped waiting (its client left): a request still queued in the engine is dropped."""
        if self._calls.pop(rid, None) is not None and self.channel is not None:
            self.channel.post(["cancel", rid])

    async def _read(self, channel: Channel) -> None:
        async for message in channel.messages():
            kind, rid, *rest = message
            if kind == "token":
                self._token(rid, *rest)
            elif kind == "result":
                self._result(rid, *rest)
            elif kind == "queued":
                self._accept(self._calls.get(rid))
            elif kind == "error":
                self._error(rid, error_from_wire(rest[0]))
            elif kind == "reply":
                reply = self._replies.pop(rid, None)
                if reply is not None and not reply.done():
                    reply.set_result(rest[0])
        self._engine_gone()

    @staticmethod
    def _accept(call: _Call | None) -> None:
        if call is not None and call.accepted is not None and not call.accepted.done():
            call.accepted.set_result(None)

    def _token(self, rid: int, index: int, token_id: int, logprob: float) -> None:
        call = self._calls.get(rid)
        if call is None or call.on_token is None:
            return
        self._accept(call)
        call.streamed[index] = call.streamed.get(index, 0) + 1
        call.on_token(index, token_id, logprob)

    def _result(self, rid: int, policy_version: int, wire: list[Any]) -> None:
        call = self._calls.pop(rid, None)
        if call is None or call.future.done():
            return
        gens = [generation_from_wire(g) for g in wire]
        if (
            call.on_token is not None
        ):  # what the engine did not stream as it went, in order, as the batcher does
            for index, gen in enumerate(gens):
                start = call.streamed.get(index, 0)
                for token_id, logprob in zip(gen.token_ids[start:], gen.logprobs[start:], strict=True):
                    call.on_token(index, token_id, logprob)
        call.future.set_result(BatchResult(gens, policy_version))

    def _error(self, rid: int, err: APIError) -> None:
        reply = self._replies.pop(rid, None)
        if reply is not None and not reply.done():
            reply.set_exception(err)
        call = self._calls.pop(rid, None)
        if call is None:
            return
        if call.accepted is not None and not call.accepted.done():
            call.accepted.set_exception(err)
        if not call.future.done():
            call.future.set_exception(err)

    def _engine_gone(self) -> None:
        """The connection closed: every waiting request gets a 503, and the process leaves."""
        self._gone = True
        err = unavailable("the engine process is gone", self.options.retry_after_s)
        for rid in list(self._calls):
            self._error(rid, err)
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(err)
        self._replies.clear()
        if self.server is not None:
            self.server.should_exit = True


STARTUP_FAILED = 3  # the exit code of a front end whose app did not start (the engine could not be reached)


def _leave(signum: int, frame: Any) -> None:
    sys.exit(0)


def hold_port(host: str, port: int) -> socket.socket:
    """The engine process's socket holding (host, port) for its front ends (`reuse_port_socket`, not
    listening; port 0: a free one). A port that something else listens on fails here with EADDRINUSE (`ascent
    serve`: "choose another --port"), as a one-process server's bind does: SO_REUSEPORT alone would let a
    second server bind it too, and the kernel would split the connections between the two. The check is a
    plain listening socket (SO_REUSEADDR, as uvicorn's: TIME_WAIT connections of an earlier server do not
    count), closed before the real one binds; a server whose front ends are not listening yet is not seen."""
    if port != 0:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        socket.create_server((host, port), family=family).close()
    return reuse_port_socket(host, port, listen=False)


def reuse_port_socket(host: str, port: int, listen: bool) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT: every front end binds one and listens; the
    engine's process binds one without listening (it holds the port, and learns it when port is 0)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError(
            "api_processes > 1 needs SO_REUSEPORT (Linux); serve from one process (api_processes=1)"
        )
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def run_frontend(spec: FrontendSpec) -> None:
    """The body of a front-end process: serve the app on the server's port until SIGTERM or the engine goes
    away.

    It ends with `os._exit`: nothing here needs cleaning up once uvicorn has shut down, and the interpreter's
    own teardown (torch, tokenizers) would take seconds."""
    import uvicorn  # deferred: only a process that serves HTTP needs it

    os.setpgrp()
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn raises it again after its graceful shutdown
        signal.signal(sig, _leave)
    code = 0
    try:
        sock = reuse_port_socket(spec.host, spec.port, listen=True)
        front = RemoteFront(spec)
        front.server = uvicorn.Server(
            uvicorn_config(build_app(front, front.lifespan), spec.host, spec.log_level)
        )
        front.server.run(sockets=[sock])
        code = 0 if front.server.started else STARTUP_FAILED
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
