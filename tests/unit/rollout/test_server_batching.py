"""The server under load and around weight updates, with scripted engines: 100 concurrent requests each get
their own answer and share engine calls; a paused server holds requests (bounded) then answers 503 with
Retry-After; a weight update bumps the policy version the records carry; a client that leaves mid-stream
does not take the server down."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import openai
import pytest

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout.server import Batcher
from tests.unit.rollout.server_support import (
    API_PROCESSES,
    EOS,
    ScriptedEngine,
    StreamingScriptedEngine,
    async_client,
    chat_user_text,
    client,
    serving,
)


def echo(request: GenerationRequest) -> list[int]:
    return [*chat_user_text(request), EOS]


@pytest.mark.parametrize("api_processes", API_PROCESSES)
def test_100_concurrent_requests_get_their_own_answers_in_shared_batches(
    chat_model: Path, api_processes: int
) -> None:
    engine = ScriptedEngine(echo, delay_s=0.05)
    with serving(engine, chat_model, api_processes=api_processes) as server:
        c = async_client(server)

        async def ask(i: int) -> str:
            out = await c.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"q{i}"}],
                extra_headers={"X-Session-Id": f"s{i}"},
            )
            return out.choices[0].message.content or ""

        async def main() -> list[str]:
            try:
                return await asyncio.gather(*(ask(i) for i in range(100)))
            finally:
                await c.close()

        answers = asyncio.run(main())
        assert answers == [f"q{i}" for i in range(100)]
        assert sum(engine.batches) == 100 and len(engine.batches) < 50  # batched, nothing lost
        for i in range(100):
            (rec,) = server.recorder.drain(f"s{i}")
            assert rec.response_text == f"q{i}" and rec.response_ids == [*rec.prompt_ids[2:-3], EOS]


@pytest.mark.parametrize("api_processes", API_PROCESSES)
def test_paused_server_answers_503_with_retry_after_then_serves(chat_model: Path, api_processes: int) -> None:
    engine = ScriptedEngine(echo)
    with serving(
        engine, chat_model, pause_timeout_s=0.3, retry_after_s=2, api_processes=api_processes
    ) as server:
        c = client(server)
        server.pause()
        start = time.monotonic()
        with pytest.raises(openai.InternalServerError) as err:
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "2"
        assert time.monotonic() - start >= 0.3  # it waited for the update first
        threading.Timer(0.1, server.resume).start()  # an update shorter than the bound: the request waits
        out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "y"}])
        assert out.choices[0].message.content == "y"


@pytest.mark.parametrize("api_processes", API_PROCESSES)
def test_weight_update_bumps_the_policy_version_of_records(chat_model: Path, api_processes: int) -> None:
    engine = ScriptedEngine(echo)
    with serving(engine, chat_model, api_processes=api_processes) as server:
        c = client(server)
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}])
        server.update_weights([("lm_head.weight", None)], version=3)
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "b"}])
        versions = [r.policy_version for r in server.recorder.drain("test-key")]
        assert versions == [0, 3] and engine.weights == ["lm_head.weight"] and server.policy_version == 3


def test_pause_waits_for_running_requests() -> None:
    batcher = Batcher(ScriptedEngine(echo, delay_s=0.2))
    batcher.start()
    future = batcher.submit(GenerationRequest([2, 50, 1, 2, 40], SamplingParams(max_new_tokens=8)))
    time.sleep(0.05)
    batcher.pause(timeout_s=5)
    assert future.done() and batcher.paused  # the running call finished before pause returned
    with pytest.raises(RuntimeError, match="weights are being updated"):
        batcher.submit(GenerationRequest([2, 50, 1, 2, 40], SamplingParams(max_new_tokens=8)))
    batcher.resume()
    batcher.close()


@pytest.mark.parametrize(("gather_s", "calls"), [(0.05, 1), (0.0, 2)])
def test_a_burst_on_an_idle_engine_starts_in_one_call(gather_s: float, calls: int) -> None:
    """Requests arriving a few ms apart on an idle engine are gathered into one call (gather_s, on a CPU
    machine with a generous window); without gathering the first starts a call alone."""
    engine = ScriptedEngine(echo, delay_s=0.2)
    batcher = Batcher(engine, gather_s=gather_s)
    batcher.start()
    futures = []
    for _ in range(3):
        futures.append(batcher.submit(GenerationRequest([2, 50, 1, 2, 40], SamplingParams(max_new_tokens=8))))
        time.sleep(0.01)
    for f in futures:
        f.result(timeout=10)
    assert batcher.calls == calls
    batcher.close()


@pytest.mark.parametrize("api_processes", API_PROCESSES)
def test_client_leaving_mid_stream_leaves_the_server_up(chat_model: Path, api_processes: int) -> None:
    engine = StreamingScriptedEngine(lambda r: [*([40] * 30), EOS], token_delay_s=0.02)
    with serving(engine, chat_model, default_max_tokens=64, api_processes=api_processes) as server:
        c = client(server)
        stream = c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            extra_headers={"X-Session-Id": "gone"},
        )
        chunks = iter(stream)
        next(chunks)  # the role chunk
        assert next(chunks).choices[0].delta.content and not engine.finished.is_set()  # tokens as they come
        stream.close()
        assert engine.finished.wait(5)
        engine.token_delay_s = 0.0
        out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "ok"}])
        assert out.choices[0].finish_reason == "stop"
        deadline = time.monotonic() + 5
        while not server.recorder.peek("gone") and time.monotonic() < deadline:
            time.sleep(0.01)
        (rec,) = server.recorder.drain("gone")  # the left stream's sample is still recorded
        assert len(rec.response_ids) == 31


@pytest.mark.parametrize("api_processes", API_PROCESSES)
def test_a_request_that_breaks_the_engine_fails_alone_with_500(chat_model: Path, api_processes: int) -> None:
    def reply(request: GenerationRequest) -> list[int]:
        if len(chat_user_text(request)) == 4:  # "boom"
            raise RuntimeError("engine exploded")
        return echo(request)

    with serving(ScriptedEngine(reply, delay_s=0.05), chat_model, api_processes=api_processes) as server:
        c = async_client(server)

        async def ask(text: str) -> str:
            try:
                out = await c.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": text}]
                )
                return out.choices[0].message.content or ""
            except openai.InternalServerError as err:
                return f"{err.status_code} {err.type}"

        async def main() -> list[str]:
            try:
                return await asyncio.gather(*(ask(t) for t in ["a", "bb", "boom", "ccc"]))
            finally:
                await c.close()

        assert asyncio.run(main()) == ["a", "bb", "500 server_error", "ccc"]
        assert client(server).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "ok"}]
        )


def test_the_fast_engine_takes_requests_mid_call_and_answers_each_as_it_ends(chat_model: Path) -> None:
    """The fast engine (CPU) behind the server: 40 concurrent seeded requests over few live calls; each gets
    exactly what a direct generate of its own request gives."""
    from ascent.rollout.fast import build_fast_engine

    engine = build_fast_engine(
        model_path=chat_model, dtype="fp32", device="cpu", page_size=16, max_model_len=256
    )
    with serving(engine, chat_model, default_max_tokens=12) as server:
        c = async_client(server)

        async def ask(i: int) -> list[int]:
            out = await c.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"q{i}"}],
                seed=i,
                max_tokens=4 + i % 9,
                extra_body={"return_token_ids": True},
            )
            return list(out.choices[0].model_extra["token_ids"])  # type: ignore[index]

        async def main() -> list[list[int]]:
            try:
                return await asyncio.gather(*(ask(i) for i in range(40)))
            finally:
                await c.close()

        answers = asyncio.run(main())
        assert server.batcher.served == 40 and server.batcher.calls < 40
    prompts = [server.chat.prompt_ids([{"role": "user", "content": f"q{i}"}]) for i in range(40)]
    direct = engine.generate(
        [
            GenerationRequest(p, SamplingParams(max_new_tokens=4 + i % 9, seed=i))
            for i, p in enumerate(prompts)
        ]
    )
    assert answers == [g[0].token_ids for g in direct]


@pytest.mark.parametrize("api_processes", [1, 2])
def test_a_sessions_next_call_reuses_its_cached_history_on_the_fast_engine(chat_model: Path, api_processes):
    """Three chat turns of one session (x-session-id): from the second on, the fast engine continues the
    session's cached K/V (usage.prompt_tokens_details.cached_tokens > 0) and gives the same greedy reply as
    the same conversation in a fresh session, which prefills it all."""
    from ascent.rollout.fast import build_fast_engine

    engine = build_fast_engine(
        model_path=chat_model, dtype="fp32", device="cpu", page_size=16, max_model_len=256
    )
    with serving(engine, chat_model, default_max_tokens=8, api_processes=api_processes) as server:
        c = client(server)

        def say(history: list[dict], session: str) -> tuple[str, int]:
            out = c.chat.completions.create(
                model="tiny", messages=history, temperature=0.0, extra_headers={"x-session-id": session}
            )
            return out.choices[0].message.content or "", out.usage.prompt_tokens_details.cached_tokens

        history: list[dict] = []
        cached = []
        for turn in range(3):
            history.append({"role": "user", "content": f"turn {turn} question"})
            reply, hit = say(history, "episode-1")
            fresh, miss = say(history, f"fresh-{turn}")
            assert reply == fresh and miss == 0
            cached.append(hit)
            history.append({"role": "assistant", "content": reply})
    assert cached[0] == 0 and all(n > 0 for n in cached[1:]), cached
