"""Tool calls and stop strings through the server, with a scripted engine (a tiny random model writes no
valid tool call): the reply's `<tool_call>` blocks come back as OpenAI `tool_calls`, whole and streamed; tool
results and assistant tool calls in the input are rendered by the chat template; stop strings are cut off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ascent.messages import GenerationRequest
from ascent.models.loading import load_tokenizer
from ascent.rollout.server import OpenAIServer
from tests.unit.rollout.server_support import API_PROCESSES, EOS, ScriptedEngine, client, serving

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]


@pytest.fixture(scope="module")
def tok(chat_model: Path):
    return load_tokenizer(chat_model)


@pytest.fixture(scope="module", params=API_PROCESSES, ids=lambda n: f"api_processes={n}")
def server(chat_model: Path, tok, request: pytest.FixtureRequest) -> Iterator[OpenAIServer]:
    """Replies with a tool call to the first question, and with the last tool result afterwards."""
    call_ids = tok.encode("Let me add. " + CALL, add_special_tokens=False) + [EOS]

    def reply(request: GenerationRequest) -> list[int]:
        text = tok.decode(request.prompt_ids)
        if "<|im_start|>t" in text:  # a tool message is in the conversation: echo its result
            result = text.rsplit("<|im_start|>t", 1)[1].split("<|im_end|>")[0]
            return tok.encode(f"It is {result}.", add_special_tokens=False) + [EOS]
        if "stop here" in text:
            return tok.encode("one two three four", add_special_tokens=False) + [EOS]
        return call_ids

    with serving(
        ScriptedEngine(reply), chat_model, default_max_tokens=200, api_processes=request.param
    ) as srv:
        yield srv


def test_tool_call_round_trip(server: OpenAIServer) -> None:
    c = client(server)
    messages: list = [{"role": "user", "content": "what is 2+3?"}]
    first = c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "It is 5." and second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.tool_calls is None


def test_streamed_tool_call(server: OpenAIServer) -> None:
    stream = client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "2+3?"}], tools=TOOLS, stream=True
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    calls = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    assert "<tool_call>" not in text and text == "Let me add."
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "add"
    assert json.loads(calls[0].function.arguments) == {"a": 2, "b": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_the_call_is_plain_text(server: OpenAIServer) -> None:
    out = client(server).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2+3?"}])
    assert out.choices[0].message.content == "Let me add. " + CALL and out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.tool_calls is None


def test_stop_strings_are_cut_whole_and_streamed(server: OpenAIServer) -> None:
    c = client(server)
    messages = [{"role": "user", "content": "stop here"}]
    out = c.chat.completions.create(model="tiny", messages=messages, stop=["three", "xyz"])
    assert out.choices[0].message.content == "one two "
    stream = c.chat.completions.create(model="tiny", messages=messages, stop="three", stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == "one two "
    text = c.completions.create(model="tiny", prompt="stop here", stop=[" t"], max_tokens=30)
    assert text.choices[0].text.startswith("one") and " t" not in text.choices[0].text


def test_tool_choice_required_is_refused(server: OpenAIServer) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="required"
        )
    assert err.value.param == "tool_choice"


def _agent_turns(server: OpenAIServer, session: str) -> None:
    """Ask, echo the tool call with its result, ask again: an agent loop over one session."""
    c = client(server, default_headers={"X-Session-Id": session})
    messages: list = [{"role": "user", "content": "what is 4+1?"}]
    first = c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    (call,) = first.choices[0].message.tool_calls or []
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    c.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)


@pytest.mark.parametrize("api_processes", API_PROCESSES)
def test_an_echoed_reply_continues_its_exact_ids(chat_model: Path, tok, api_processes: int) -> None:
    """The model writes its call with its own JSON spacing and key order; a re-render of the history would
    write other ids. The second call of the session starts with exactly the first call's prompt and reply
    (with two front ends, whichever process each call lands on)."""
    odd = '<tool_call>{"arguments":{"b":1,"a":4},"name":"add"}</tool_call>'
    call_ids = tok.encode(odd, add_special_tokens=False) + [EOS]

    def reply(request: GenerationRequest) -> list[int]:
        text = tok.decode(request.prompt_ids)
        return (
            tok.encode("It is 5.", add_special_tokens=False) + [EOS] if "<|im_start|>t" in text else call_ids
        )

    with serving(
        ScriptedEngine(reply), chat_model, default_max_tokens=200, api_processes=api_processes
    ) as srv:
        _agent_turns(srv, "s1")
        first, second = srv.take("s1")
        assert first.response_ids == call_ids
        assert second.prompt_ids[: len(first.prompt_ids) + len(call_ids)] == first.prompt_ids + call_ids
        assert srv.threads.continued == 1 and srv.take("s1") == []
        srv.threads.forget("s2")  # a fresh session renders the history again: the ids differ
        rendered = srv.chat.prompt_ids(
            [
                {"role": "user", "content": "what is 4+1?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "add", "arguments": {"a": 4, "b": 1}}}
                    ],
                },
                {"role": "tool", "content": "5"},
            ],
            tools=TOOLS,
        )
        assert rendered[: len(first.prompt_ids) + len(call_ids)] != first.prompt_ids + call_ids
