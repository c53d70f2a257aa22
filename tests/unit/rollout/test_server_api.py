"""The OpenAI-compatible server on a real tiny model (reference engine, CPU) through the official `openai`
client: chat, streaming, n > 1, logprobs, completions, models and health, refusals in OpenAI's shape, and
records that hold exactly the tokens and logprobs the engine sampled."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from ascent.envs.chat import ChatTokens
from ascent.messages import GenerationRequest, SamplingParams
from ascent.models.loading import load_tokenizer
from ascent.rollout import build_engine
from ascent.rollout.server import OpenAIServer
from tests.unit.rollout.server_support import API_PROCESSES, KEY, client, serving

HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module", params=API_PROCESSES, ids=lambda n: f"api_processes={n}")
def server(chat_model: Path, request: pytest.FixtureRequest) -> Iterator[OpenAIServer]:
    engine = build_engine("reference", model_path=chat_model, device="cpu")
    with serving(
        engine, chat_model, max_model_len=512, default_max_tokens=12, api_processes=request.param
    ) as srv:
        yield srv


def post(server: OpenAIServer, path: str, body: bytes, key: str | None = KEY) -> tuple[int, dict[str, Any]]:
    """A raw POST (for bodies the official client cannot send); -> (status, JSON body)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"{server.url}{path}", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_chat_n_logprobs_and_token_exact_records(server: OpenAIServer, chat_model: Path) -> None:
    c = client(server)
    out = c.chat.completions.create(
        model="tiny",
        messages=HI,
        n=3,
        logprobs=True,
        seed=7,
        max_tokens=10,
        temperature=1.0,
        extra_body={"return_token_ids": True},
        extra_headers={"X-Session-Id": "ep-1"},
    )
    assert out.object == "chat.completion" and len(out.choices) == 3
    assert [ch.index for ch in out.choices] == [0, 1, 2]
    records = server.recorder.drain("ep-1")
    assert len(records) == 3 and server.recorder.peek("ep-1") == []
    tok = load_tokenizer(chat_model)
    prompt = ChatTokens(tok).prompt_ids(HI)
    assert out.model_extra is not None and out.model_extra["prompt_token_ids"] == prompt
    engine = build_engine("reference", model_path=chat_model, device="cpu")  # the same weights, run directly
    params = SamplingParams(temperature=1.0, max_new_tokens=10, n=3, seed=7)
    direct = engine.generate([GenerationRequest(prompt, params)])[0]
    for choice, rec, gen in zip(out.choices, records, direct, strict=True):
        ids = (choice.model_extra or {})["token_ids"]
        assert rec.prompt_ids == prompt and rec.response_ids == ids == gen.token_ids
        assert rec.logprobs == [e.logprob for e in choice.logprobs.content] == pytest.approx(gen.logprobs)
        assert rec.finish_reason == choice.finish_reason and rec.policy_version == 0
        assert choice.message.content == tok.decode(ids, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(prompt)
    assert out.usage.completion_tokens == sum(len(r.response_ids) for r in records)


def test_streamed_chat_matches_its_record(server: OpenAIServer) -> None:
    c = client(server)
    stream = c.chat.completions.create(
        model="tiny",
        messages=HI,
        stream=True,
        max_tokens=8,
        logprobs=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Session-Id": "stream-1"},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    logprobs = [
        e.logprob
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content
    ]
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    (rec,) = server.recorder.drain("stream-1")
    assert text == rec.response_text and logprobs == rec.logprobs and finish == [rec.finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(rec.response_ids)


def test_completions_models_and_health(server: OpenAIServer) -> None:
    c = client(server)
    out = c.completions.create(model="tiny", prompt=["ab", "cd"], n=2, max_tokens=4, logprobs=0, seed=1)
    assert len(out.choices) == 4 and all(len(ch.logprobs.token_logprobs) <= 4 for ch in out.choices)
    records = server.recorder.drain(KEY)  # no X-Session-Id: filed under the caller's key
    assert sorted(r.index for r in records) == [0, 1, 2, 3]
    assert [m.id for m in c.models.list().data] == ["tiny"]
    with urllib.request.urlopen(f"{server.url.removesuffix('/v1')}/health", timeout=10) as resp:
        assert json.loads(resp.read()) == {"status": "ok", "policy_version": 0, "paused": False}


def test_wrong_or_missing_key_is_401(server: OpenAIServer) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        client(server, key="nope").chat.completions.create(model="tiny", messages=HI)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    status, body = post(server, "/chat/completions", b'{"model": "tiny", "messages": []}', key=None)
    assert status == 401 and body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": [{"role": "usr", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"messages": HI, "temperature": 5}, "temperature"),
        ({"messages": HI, "n": 0}, "n"),
        ({"messages": HI, "max_tokens": 0}, "max_tokens"),
        ({"messages": HI, "top_logprobs": 3, "logprobs": True}, "top_logprobs"),
        ({"messages": HI, "presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": [{"role": "user"}]}, "messages[0]"),
    ],
)
def test_malformed_chat_is_400_naming_the_field(server: OpenAIServer, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model="tiny", **kwargs)
    assert err.value.status_code == 400 and err.value.param == param
    assert isinstance(err.value.body, dict) and err.value.body["type"] == "invalid_request_error"
    assert str(err.value.body["message"]).startswith(param)


def test_bad_json_unknown_model_and_bad_token_ids(server: OpenAIServer) -> None:
    status, body = post(server, "/chat/completions", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = post(server, "/chat/completions", b"[1, 2]")
    assert status == 400 and "JSON object" in body["error"]["message"]
    with pytest.raises(openai.NotFoundError) as err:
        client(server).chat.completions.create(model="gpt-4o", messages=HI)
    assert err.value.code == "model_not_found" and "tiny" in str(err.value.body)
    with pytest.raises(openai.BadRequestError) as err:
        client(server).completions.create(model="tiny", prompt=[5, 10**6])
    assert err.value.param == "prompt" and "outside the vocabulary" in str(err.value.body)


def test_context_overflow_is_400_naming_the_limit(server: OpenAIServer) -> None:
    c = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="tiny", messages=HI, max_tokens=600)
    assert err.value.code == "context_length_exceeded" and err.value.param == "max_tokens"
    assert "maximum context length is 512 tokens" in str(err.value.body)
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 600}])
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
    out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 500}])
    assert out.usage.completion_tokens <= 512 - out.usage.prompt_tokens  # the default budget is cut to fit
