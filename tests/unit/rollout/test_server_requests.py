"""What a request may ask of the server, through the official `openai` client on a tiny model (reference
engine, CPU): `response_format` and guided decoding constrain the sampled tokens (parseable JSON, a schema's
shape, one of the choices), are refused by name on an engine without a grammar mask, and the tokens the
grammar forced leave the loss of the agent episode assembled from the records; fields it cannot honour
(`parallel_tool_calls: false`, ...) and fields it does not know are a 400 naming them, never silently
ignored; informational fields pass; the legacy completions return each sampled token's logprob with
`logprobs=0`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from ascent.orchestrator.agent_segments import segment_episode, segments
from ascent.rollout import build_engine
from ascent.rollout.server import OpenAIServer
from tests.unit.rollout.server_support import ScriptedEngine, client, serving

HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def server(chat_model: Path) -> Iterator[OpenAIServer]:
    engine = build_engine("reference", model_path=chat_model, device="cpu")
    with serving(engine, chat_model, max_model_len=512, default_max_tokens=4) as srv:
        yield srv


@pytest.mark.parametrize(
    ("kwargs", "param", "says"),
    [
        ({"response_format": {"type": "xml"}}, "response_format", "json_object or json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            "give the",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "response_format",
            "cannot be compiled",
        ),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a+"}},
            "guided_regex",
            "not both",
        ),
        (
            {"extra_body": {"guided_grammar": "root ::= 'a'"}},
            "guided_grammar",
            "response_format, guided_json",
        ),
        ({"parallel_tool_calls": False}, "parallel_tool_calls", "set it to true"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions", "send them as tools"),
        ({"extra_body": {"ignore_eos": True}}, "ignore_eos", "unknown parameter for this endpoint"),
        ({"logit_bias": {"5": 10}}, "logit_bias", "leave it out"),
    ],
)
def test_what_the_server_cannot_honour_is_refused_by_name(
    server: OpenAIServer, kwargs: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model="tiny", messages=HI, **kwargs)
    assert err.value.status_code == 400 and err.value.param == param
    message = str(err.value.body["message"])  # type: ignore[index]
    assert message.startswith(param) and says in message


OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def test_response_format_constrains_the_reply_to_json(server: OpenAIServer) -> None:
    c = client(server)
    out = c.chat.completions.create(
        model="tiny", messages=HI, response_format={"type": "json_object"}, n=8, seed=1, max_tokens=40
    )
    # a random tiny model may run out of tokens inside a string (finish "length", JSON cut short, as OpenAI's
    # JSON mode warns); every reply it finished is a JSON object, and most finish
    finished = [ch.message.content or "" for ch in out.choices if ch.finish_reason == "stop"]
    assert all(ch.message.content and ch.message.content.startswith("{") for ch in out.choices)
    assert len(finished) >= 2 and all(isinstance(json.loads(text), dict) for text in finished)
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": OK_SCHEMA}}
    out = c.chat.completions.create(
        model="tiny", messages=HI, response_format=schema, n=3, seed=2, max_tokens=20
    )  # type: ignore[arg-type]
    assert [set(json.loads(ch.message.content or "")) for ch in out.choices] == [{"ok"}] * 3
    text = c.completions.create(
        model="tiny", prompt="ab", extra_body={"guided_choice": ["yes", "no"]}, seed=3
    )
    assert text.choices[0].text in ("yes", "no")


def test_the_tokens_response_format_forced_leave_the_agent_episodes_loss(server: OpenAIServer) -> None:
    """Under a JSON schema, the reference engine records which sampled tokens the grammar allowed alone, and
    the agent episode assembled from the session's records gives exactly those loss mask 0, as the env runner
    does: of `{"ok":true}<|im_end|>` (one token a character) only the `t` or `f` was a choice."""
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": OK_SCHEMA}}
    c = client(server, default_headers={"X-Session-Id": "forced"})
    reply = c.chat.completions.create(
        model="tiny", messages=HI, response_format=schema, seed=4, max_tokens=20
    )
    (record,) = server.take("forced")
    assert json.loads(reply.choices[0].message.content or "") in ({"ok": True}, {"ok": False})
    assert len(record.forced) == len(record.response_ids)
    (seg,) = segments([record])
    episode = segment_episode(seg, row_id=0, max_turns=1, max_tokens=100, decode=str)
    assert episode.response_ids == record.response_ids
    assert episode.loss_mask == [0 if f else 1 for f in record.forced]
    assert episode.loss_mask.count(1) == 1


def test_an_engine_without_a_grammar_mask_refuses_response_format(chat_model: Path) -> None:
    with (
        serving(ScriptedEngine(lambda r: [1]), chat_model) as srv,
        pytest.raises(openai.BadRequestError) as err,
    ):
        client(srv).chat.completions.create(
            model="tiny", messages=HI, response_format={"type": "json_object"}
        )
    assert err.value.param == "response_format" and "--engine reference" in str(err.value.body)


def test_harmless_values_and_informational_fields_pass(server: OpenAIServer) -> None:
    out = client(server).chat.completions.create(
        model="tiny",
        messages=HI,
        response_format={"type": "text"},
        parallel_tool_calls=True,
        user="u1",
        metadata={"run": "x"},
        max_tokens=2,
        extra_body={"guided_json": None},
    )
    assert out.choices[0].finish_reason in ("stop", "length")


def test_completions_refuse_chat_fields_and_alternatives(server: OpenAIServer) -> None:
    c = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="tiny", prompt="ab", extra_body={"max_completion_tokens": 3})
    assert err.value.param == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="tiny", prompt="ab", logprobs=2)
    assert err.value.param == "logprobs" and "set it to 0" in str(err.value.body)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_logprobs_are_the_sampled_tokens(server: OpenAIServer, stream: bool) -> None:
    c = client(server, default_headers={"X-Session-Id": f"lp-{stream}"})
    out = c.completions.create(model="tiny", prompt="ab", max_tokens=5, logprobs=0, seed=3, stream=stream)
    chunks = list(out) if stream else [out]
    tokens, logprobs, offsets = [], [], []
    for chunk in chunks:
        lp = chunk.choices[0].logprobs
        if lp is not None:
            assert lp.top_logprobs is None
            tokens += lp.tokens or []
            logprobs += lp.token_logprobs or []
            offsets += lp.text_offset or []
    (rec,) = server.recorder.drain(f"lp-{stream}")
    assert logprobs == pytest.approx(rec.logprobs) and len(tokens) == len(rec.response_ids) > 0
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
