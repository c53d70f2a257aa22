"""Tool calls in each family's format (`ascent.rollout.server.tool_parsers`): Hermes/Qwen blocks, Llama 3
JSON, Mistral's two formats; a reply that is not well-formed calls is left as text; the parser is chosen from
the chat template's markers or by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ascent.rollout.server.chat import split_tool_calls
from ascent.rollout.server.tool_parsers import (
    TOOL_PARSERS,
    ParsedCall,
    detect_tool_parser,
    hermes,
    llama3_json,
    mistral,
    tool_parser,
)

ADD = ParsedCall("add", {"a": 1, "b": 2})
NOW = ParsedCall("now", {})


def test_hermes_blocks_and_the_text_around_them() -> None:
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert hermes(text) == ("Let me add.", [ADD])
    two = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "now"}</tool_call>'
    )
    assert hermes(two) == (None, [ADD, NOW])
    assert hermes("no call here") is None
    assert hermes('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>') is None  # broken JSON


def test_llama3_json_with_and_without_python_tag() -> None:
    assert llama3_json('{"name": "add", "parameters": {"a": 1, "b": 2}}') == (None, [ADD])
    assert llama3_json('<|python_tag|>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}') == (
        None,
        [ADD],
    )
    both = '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "now", "parameters": {}}'
    assert llama3_json(both) == (None, [ADD, NOW])
    assert llama3_json("The answer is 3.") is None
    assert llama3_json('{"name": "add", "parameters": {"a": 1}} and some prose') is None
    assert llama3_json('{"answer": 3}') is None  # JSON, but not a call


def test_mistral_list_and_args_formats() -> None:
    assert mistral(
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]'
    ) == (
        None,
        [ADD, NOW],
    )
    assert mistral('Sure. [TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]now[ARGS]{}') == (
        "Sure.",
        [ADD, NOW],
    )
    assert mistral("no calls") is None
    assert mistral('[TOOL_CALLS][{"name": "add", "arguments": ') is None
    assert mistral("[TOOL_CALLS]add{}") is None  # no [ARGS]


def test_split_tool_calls_gives_openai_shapes_or_none() -> None:
    content, calls = split_tool_calls(
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]', mistral
    ) or (
        "",
        [],
    )
    assert content is None and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert split_tool_calls("plain text", mistral) is None


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{% if tools %}<tool_call>{{ t }}</tool_call>{% endif %}", "hermes"),
        ("{{ '<|python_tag|>' }}{% if message.role == 'ipython' %}", "llama3_json"),
        ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{{ '[TOOL_CALLS]' }}", "mistral"),
        ({"default": "plain", "tool_use": "[TOOL_CALLS]"}, "mistral"),
        ("{{ messages }}", "hermes"),
        (None, "hermes"),
    ],
)
def test_the_parser_is_chosen_from_the_chat_template(template: object, name: str) -> None:
    assert detect_tool_parser(template) == name
    assert tool_parser("auto", SimpleNamespace(chat_template=template)) == (name, TOOL_PARSERS[name])


def test_a_parser_chosen_by_name_and_an_unknown_name() -> None:
    tok = SimpleNamespace(chat_template="<tool_call>")
    assert tool_parser("mistral", tok)[1] is mistral
    with pytest.raises(ValueError, match="--tool-parser nope: unknown; use auto or one of hermes"):
        tool_parser("nope", tok)
