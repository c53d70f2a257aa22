"""OpenAI-style tool calls in dataset rows -> what chat templates read (`ascent.data`, next to
`ascent.models.content`).

A dataset written for the OpenAI API has assistant messages like
`{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
"function": {"name": "zoom", "arguments": "{\\"x\\": 1}"}}]}` followed by `{"role": "tool",
"tool_call_id": "c1", "content": ...}`. The model's chat template renders such calls in its family's own
format (Qwen's `<tool_call>` blocks, ...), the same rendering the OpenAI endpoint gives a request's history
(`ascent.rollout.server.chat`): arguments as JSON objects, a null content as "". `template_tool_calls` makes
that form and refuses, naming the field and the fix, a call it cannot render: a call is never dropped. Data
rows pass their messages through `with_template_calls` before `ascent.models.content.template_messages`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ascent.errors import AscentError

CALL_EXAMPLE = (
    '{"type": "function", "function": {"name": "zoom", "arguments": "{\\"x\\": 1}"}} (arguments: a JSON '
    "object, or a string holding one)"
)


class ToolCallError(AscentError, ValueError):
    """A `tool_calls` entry a chat template cannot render; the message names the field and the fix."""


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """A call's `arguments` (a JSON object, or a string holding one; "" or absent: {}) as a dict."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ToolCallError(
                f"{where}.arguments is {value[:80]!r}, not JSON ({err.msg}); write the arguments as a JSON "
                'object or a string holding one, e.g. "{\\"x\\": 1}"'
            ) from err
    if not isinstance(value, dict):
        raise ToolCallError(
            f"{where}.arguments is {type(value).__name__} {value!r:.80}; the arguments must be a JSON object "
            '(a dict, or a string holding one, e.g. "{\\"x\\": 1}")'
        )
    return value


def template_call(call: Any, where: str) -> dict[str, Any]:
    """One OpenAI `tool_calls` entry -> `{"type": "function", "function": {"name", "arguments": dict}}` (and
    its `id`); raises ToolCallError naming `where` (e.g. "tool_calls[0]") and the fix."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        raise ToolCallError(f"{where} has no 'function' object; give each call as {CALL_EXAMPLE}")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolCallError(
            f"{where}.function.name is {name!r}; give the called function's name, as in {CALL_EXAMPLE}"
        )
    out: dict[str, Any] = {
        "type": "function",
        "function": {"name": name, "arguments": _arguments(function.get("arguments"), f"{where}.function")},
    }
    if call.get("id") is not None:
        out["id"] = call["id"]
    return out


def template_tool_calls(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message -> the dict a chat template renders: an assistant message's `tool_calls` (a non-empty list)
    in template form and a null content as ""; other messages unchanged. Raises ToolCallError."""
    calls = message.get("tool_calls")
    if calls is None or calls == []:  # no calls (APIs write both)
        return dict(message)
    if message.get("role") != "assistant":
        raise ToolCallError(
            f"'tool_calls' is set on a {message.get('role')!r} message; only assistant messages call tools"
        )
    if not isinstance(calls, list) or not calls:
        raise ToolCallError(
            f"'tool_calls' is {calls!r:.80}; give a non-empty list of calls, each {CALL_EXAMPLE}, or remove it"
        )
    content = message.get("content")
    return {
        **message,
        "content": "" if content is None else content,
        "tool_calls": [template_call(c, f"tool_calls[{k}]") for k, c in enumerate(calls)],
    }


def with_template_calls(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages -> the same with every assistant's `tool_calls` in template form (`template_tool_calls`);
    raises ToolCallError naming the message."""
    out = []
    for i, m in enumerate(messages):
        try:
            out.append(template_tool_calls(m))
        except ToolCallError as err:
            raise ToolCallError(f"message {i}: {err}") from err
    return out


def tool_calls_problem(message: Mapping[str, Any]) -> str | None:
    """What is wrong with a message's `tool_calls`, or None (none, or all renderable)."""
    try:
        template_tool_calls(message)
    except ToolCallError as err:
        return str(err)
    return None


def content_may_be_null(message: Mapping[str, Any]) -> bool:
    """Whether a message may leave `content` null: an assistant message that calls tools (OpenAI's form)."""
    return message.get("role") == "assistant" and bool(message.get("tool_calls"))
