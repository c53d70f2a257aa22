"""The engine hub of `--api-processes N` against a stand-in server, over its real unix socket: a request
cancelled, or whose front end goes away, while it waits out a weight update is dropped once it is queued
(never run, recorded or answered); a request that fails before reaching the engine is answered with a 500;
a socket that cannot listen fails the start at once. The front end's own waits for the engine are bounded."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ascent.messages import Generation, GenerationRequest, SamplingParams
from ascent.models.loading import load_tokenizer
from ascent.rollout.server import Limits, ServerOptions
from ascent.rollout.server import frontend as frontend_module
from ascent.rollout.server.batcher import BatchResult
from ascent.rollout.server.errors import APIError
from ascent.rollout.server.frontend import FrontendSpec, RemoteFront
from ascent.rollout.server.hub import EngineHub
from ascent.rollout.server.ipc import Channel, error_from_wire, request_to_wire
from ascent.rollout.server.threads import Threads

WIRE = request_to_wire(GenerationRequest([5, 6, 7], SamplingParams(max_new_tokens=4)))


class HeldServer:
    """What the hub uses of `OpenAIServer`; `submit` waits (as for a weight update) until `open` is set,
    then raises `fail` or hands out a future the test completes."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.fail: Exception | None = None
        self.futures: dict[str, Future[BatchResult]] = {}  # by completion id
        self.batcher = SimpleNamespace(engine=None)  # not a streaming engine
        self.threads = Threads()

    async def submit(self, request: Any, session: str, endpoint: str, completion_id: str, *rest: Any) -> Any:
        while not self.open.is_set():
            await asyncio.sleep(0.01)
        if self.fail is not None:
            raise self.fail
        future = self.futures[completion_id] = Future()
        return future


def _submit(rid: int) -> list[Any]:
    return ["submit", rid, "s", "chat", f"c{rid}", 0, False, WIRE]


async def _until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _with_hub(body: Any) -> Any:
    """Run `body(hub, server, channel)` on a fresh event loop, connected to a started hub."""
    server = HeldServer()
    hub = EngineHub(server)  # type: ignore[arg-type]
    hub.start()

    async def main() -> Any:
        channel = Channel(*await asyncio.open_unix_connection(hub.path))
        try:
            return await body(hub, server, channel)
        finally:
            channel.close()

    try:
        return asyncio.run(main())
    finally:
        hub.close()


def test_a_request_cancelled_while_it_waits_out_an_update_is_dropped_once_queued() -> None:
    async def body(hub: EngineHub, server: HeldServer, channel: Channel) -> tuple[list[bool], list[Any]]:
        for message in (_submit(0), ["cancel", 0], _submit(1)):
            channel.post(message)
        await asyncio.sleep(0.2)  # both wait at the server's gate; the cancel has arrived
        server.open.set()
        await _until(lambda: len(server.futures) == 2)  # (the hub cancels one as soon as it has it)
        cancelled = [server.futures[c].cancelled() for c in ("c0", "c1")]
        server.futures["c1"].set_result(BatchResult([Generation([9, 1], [-0.5, -0.5], "stop")], 3))
        messages = channel.messages()
        return cancelled, await asyncio.wait_for(messages.__anext__(), 10)

    cancelled, (kind, rid, version, _) = _with_hub(body)
    assert cancelled == [True, False] and (kind, rid, version) == ("result", 1, 3)


def test_a_request_whose_front_end_went_away_while_it_waited_never_runs() -> None:
    async def body(hub: EngineHub, server: HeldServer, channel: Channel) -> Future[BatchResult]:
        channel.post(_submit(0))
        await asyncio.sleep(0.2)
        channel.close()  # the front end dies while its request waits out the update
        await asyncio.sleep(0.2)
        server.open.set()
        await _until(lambda: len(server.futures) == 1)
        return server.futures["c0"]

    assert _with_hub(body).cancelled()  # so the server records nothing under the session


@pytest.mark.parametrize("fail", [ValueError("bad params"), APIError(503, "paused; retry in 5 s.")])
def test_a_request_that_fails_before_the_engine_is_answered(fail: Exception) -> None:
    async def body(hub: EngineHub, server: HeldServer, channel: Channel) -> list[Any]:
        server.fail = fail
        server.open.set()
        channel.post(_submit(0))
        messages = channel.messages()
        return await asyncio.wait_for(messages.__anext__(), 10)

    kind, rid, wire = _with_hub(body)
    err = error_from_wire(wire)
    assert (kind, rid) == ("error", 0)
    if isinstance(fail, APIError):
        assert err.status == 503 and err.message == fail.message
    else:
        assert err.status == 500 and "ValueError: bad params" in err.message


def test_a_hub_that_cannot_listen_fails_its_start_at_once() -> None:
    hub = EngineHub(HeldServer())  # type: ignore[arg-type]
    hub.path = os.path.join(hub._dir, "x" * 120 + ".sock")  # past the AF_UNIX path limit
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="cannot listen on .*set TMPDIR"):
        hub.start(timeout_s=20)
    assert time.monotonic() - started < 5 and not os.path.exists(hub._dir)


def test_the_front_ends_waits_for_the_engine_are_bounded(
    chat_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that never answers: a health call and a stream's acceptance end in a 503 naming what was
    waited for (and the stream's request is cancelled in the engine), not in a hang."""
    monkeypatch.setattr(frontend_module, "RPC_TIMEOUT_S", 0.3)
    tokenizer = load_tokenizer(chat_model)
    options = ServerOptions("tiny", Limits(512, len(tokenizer)), None, pause_timeout_s=0.0)
    path = str(tmp_path / "mute.sock")
    heard: list[str] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for message in Channel(reader, writer).messages():
            heard.append(message[0])

    async def main() -> None:
        listener = await asyncio.start_unix_server(mute, path=path)
        front = RemoteFront(FrontendSpec(path, options, tokenizer, "127.0.0.1", 0, "critical"))
        async with listener, front.lifespan(None):
            with pytest.raises(APIError, match=r"did not answer a 'health' call within 0.3 s"):
                await front.health()
            request = GenerationRequest([5, 6], SamplingParams(max_new_tokens=2))
            with pytest.raises(APIError, match="did not accept a streamed request within 0.3 s"):
                await front.submit(request, "s", "chat", "c0", on_token=lambda *_: None)
            await _until(lambda: "cancel" in heard)
        assert front._calls == {} and front._replies == {}

    asyncio.run(main())
