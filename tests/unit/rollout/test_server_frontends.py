"""The server with its HTTP work in front-end processes (`api_processes=2`): 100 concurrent calls, streamed
and not, spread over both front ends, each answered with its own reply and recorded under its own session;
a front end killed mid-request costs only its own connections (the engine neither hangs nor loses the
others), is restarted, and a front end that keeps dying stops the server with the reason; a front end
that cannot reach the engine fails the start, naming its exit code, and leaves no thread, directory or port
behind; a port another server listens on is refused, SO_REUSEPORT notwithstanding."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import time
from pathlib import Path

import openai
import pytest

from ascent.entrypoints.serve import ServeError, serve
from ascent.models.loading import load_tokenizer
from ascent.rollout.server import Limits, OpenAIServer, ServerOptions
from ascent.rollout.server import pool as pool_module
from ascent.rollout.server.frontend import STARTUP_FAILED, FrontendSpec, hold_port, reuse_port_socket
from ascent.rollout.server.hub import EngineHub
from ascent.rollout.server.pool import FrontendError, FrontendPool
from tests.unit.rollout.server_support import (
    EOS,
    ScriptedEngine,
    async_client,
    chat_user_text,
    client,
    serving,
)


def echo(request) -> list[int]:  # type: ignore[no-untyped-def]
    return [*chat_user_text(request), EOS]


async def _ask(c: openai.AsyncOpenAI, i: int) -> str:
    messages = [{"role": "user", "content": f"q{i}"}]
    headers = {"X-Session-Id": f"s{i}"}
    if i % 2:
        stream = await c.chat.completions.create(
            model="tiny",
            messages=messages,
            stream=True,  # type: ignore[arg-type]
            extra_headers=headers,
        )
        return "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    out = await c.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        extra_headers=headers,
    )
    return out.choices[0].message.content or ""


def test_100_concurrent_calls_over_two_front_ends_are_neither_lost_nor_mixed_up(chat_model: Path) -> None:
    engine = ScriptedEngine(echo, delay_s=0.05)
    with serving(engine, chat_model, api_processes=2) as server:
        clients = [async_client(server) for _ in range(4)]  # more connections, opened from several pools

        async def main() -> list[str]:
            try:
                return await asyncio.gather(*(_ask(clients[i % 4], i) for i in range(100)))
            finally:
                for c in clients:
                    await c.close()

        answers = asyncio.run(main())
        assert answers == [f"q{i}" for i in range(100)]
        assert sum(engine.batches) == 100 and len(engine.batches) < 50
        for i in range(100):
            (rec,) = server.recorder.drain(f"s{i}")
            assert rec.response_text == f"q{i}" and rec.response_ids == [*rec.prompt_ids[2:-3], EOS]
        pids = {p.pid for p in server.frontends.procs}
        assert set(server._hub.requests) == pids and sum(server._hub.requests.values()) == 100


def _wait(condition, timeout_s: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_killed_front_end_is_restarted_and_costs_only_its_connections(
    chat_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "MAX_DEATHS", 2)
    engine = ScriptedEngine(echo, delay_s=1.0)
    with serving(engine, chat_model, api_processes=2) as server:
        pool, hub = server.frontends, server._hub
        clients = [async_client(server) for _ in range(4)]

        async def ask(i: int) -> str:
            try:
                out = await clients[i % 4].chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"k{i}"}]
                )
                return out.choices[0].message.content or ""
            except openai.APIConnectionError:
                return "lost"

        async def kill_one_mid_call() -> tuple[int, list[str]]:
            calls = asyncio.gather(*(ask(i) for i in range(20)))
            await asyncio.to_thread(_wait, lambda: engine.batches)  # the engine is busy with them
            victim = max(hub.requests, key=hub.requests.__getitem__)
            os.kill(victim, signal.SIGKILL)
            try:
                return victim, await calls
            finally:
                for c in clients:
                    await c.close()

        victim, answers = asyncio.run(kill_one_mid_call())
        assert "lost" in answers and all(a in ("lost", f"k{i}") for i, a in enumerate(answers))
        survivor = sum(n for pid, n in hub.requests.items() if pid != victim)
        assert 20 - answers.count("lost") == survivor  # every call the other front end took was answered
        server.pause(timeout_s=10)  # the engine is idle again: nothing waits on the dead process
        server.resume()
        _wait(lambda: pool.restarts == 1 and len(hub.peers) == 2)
        engine.delay_s = 0.0
        assert all(
            client(server)
            .chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"a{i}"}])
            .choices[0]
            .message.content
            == f"a{i}"
            for i in range(10)
        )
        os.kill(pool.procs[0].pid, signal.SIGKILL)  # a second death within the window: a crash loop
        _wait(lambda: pool.failure is not None)
        assert "2 front-end processes died" in pool.failure and "--api-processes 1" in pool.failure
        _wait(lambda: not any(p.is_alive() for p in pool.procs))
        host, port = (
            server.url.removeprefix("http://").removesuffix("/v1").split(":")  # type: ignore[union-attr]
        )
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5)
        with pytest.raises(FrontendError, match="2 front-end processes died"):
            pool.wait()


def test_a_front_end_that_cannot_reach_the_engine_fails_the_start(chat_model: Path) -> None:
    tokenizer = load_tokenizer(chat_model)
    options = ServerOptions("tiny", Limits(512, len(tokenizer)), None, api_processes=1)
    hub = EngineHub(None)  # type: ignore[arg-type]  # never asked anything: the front end cannot connect
    sock = reuse_port_socket("127.0.0.1", 0, listen=False)
    port = sock.getsockname()[1]
    spec = FrontendSpec(
        os.path.join(hub._dir, "missing.sock"), options, tokenizer, "127.0.0.1", port, "critical"
    )
    hub.start()
    try:
        with pytest.raises(FrontendError, match=rf"ascent-api-0 \(exit code {STARTUP_FAILED}\) died"):
            FrontendPool(hub, sock, spec, 1).start()
    finally:
        hub.close()


def test_a_server_whose_front_ends_fail_to_start_leaves_nothing_behind(
    chat_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: FrontendPool) -> None:
        raise FrontendError("--api-processes 2: the front-end processes did not start: (a test).")

    monkeypatch.setattr(FrontendPool, "start", fail)
    tokenizer = load_tokenizer(chat_model)
    options = ServerOptions("tiny", Limits(512, len(tokenizer)), None, api_processes=2)
    server = OpenAIServer(ScriptedEngine(echo), tokenizer, options)
    with pytest.raises(FrontendError, match="did not start"):
        server.start()
    assert server.batcher._thread is not None and not server.batcher._thread.is_alive()
    assert server._hub._thread is not None and not server._hub._thread.is_alive()
    assert not os.path.exists(server._hub._dir)
    port = int(server.url.rsplit(":", 1)[1].removesuffix("/v1"))  # type: ignore[union-attr]
    socket.create_server(("127.0.0.1", port)).close()  # the port is free again


def test_a_port_another_server_listens_on_is_refused(chat_model: Path) -> None:
    holder = reuse_port_socket("127.0.0.1", 0, listen=False)  # a running server's engine process ...
    port = holder.getsockname()[1]
    listener = reuse_port_socket("127.0.0.1", port, listen=True)  # ... and its front end
    tokenizer = load_tokenizer(chat_model)
    options = ServerOptions("tiny", Limits(512, len(tokenizer)), None, api_processes=2)
    try:
        with pytest.raises(OSError) as err:
            hold_port("127.0.0.1", port)
        assert err.value.errno == errno.EADDRINUSE
        with pytest.raises(ServeError, match=rf"--port {port}: cannot listen there"):
            serve(OpenAIServer(ScriptedEngine(echo), tokenizer, options), "127.0.0.1", port, "critical")
    finally:
        listener.close()
        holder.close()
    hold_port("127.0.0.1", port).close()  # free again
