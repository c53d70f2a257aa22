"""Chat messages in, tool calls out: the OpenAI chat format <-> the model's chat template
(`ascent.rollout.server`).

Requests' messages become the dicts Hugging Face chat templates read (text parts joined; a content list with
image parts kept as parts, which `prepare.chat_images` turns into the template's image placeholders; assistant
`tool_calls` with their JSON arguments as objects, as Qwen's template expects; tool results as `tool`
messages) and are rendered with `tools=` by `ascent.envs.chat.ChatTokens`, the same encoding episodes use.
A reply's tool calls, in its model family's format (`tool_parsers.py`: Hermes/Qwen `<tool_call>` blocks,
Llama 3 JSON, Mistral `[TOOL_CALLS]`), become OpenAI `tool_calls`; a reply whose calls do not all parse
comes back as plain text, so the client sees what the model wrote.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

from ascent.rollout.server.schemas import ChatMessage, ContentPart, TextPart, Tool, ToolCallIn
from ascent.rollout.server.tool_parsers import Parser


def message_text(content: str | Sequence[ContentPart] | None) -> str:
    """A message's content as one string (text parts joined, image parts left out)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


def template_content(content: str | Sequence[ContentPart] | None) -> str | list[dict[str, Any]]:
    """A message's content for the template: one string, or its parts as dicts when it shows an image."""
    if content is None or isinstance(content, str) or all(isinstance(p, TextPart) for p in content):
        return message_text(content)
    return [p.model_dump(exclude_none=True) for p in content]


def _template_call(call: ToolCallIn) -> dict[str, Any]:
    args: Any = call.function.arguments
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # not JSON: the template shows the string as given
            args = json.loads(args) if args.strip() else {}
    out: dict[str, Any] = {"type": "function", "function": {"name": call.function.name, "arguments": args}}
    if call.id is not None:
        out["id"] = call.id
    return out


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Request messages -> the dicts a chat template renders."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": template_content(m.content)}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [_template_call(c) for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def template_tools(tools: Sequence[Tool] | None) -> list[dict[str, Any]] | None:
    """Function schemas for the template's `tools=` (None: the template shows none)."""
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None


def split_tool_calls(text: str, parser: Parser) -> tuple[str | None, list[dict[str, Any]]] | None:
    """A reply's text (special tokens kept) -> (content, OpenAI tool_calls); None: no well-formed calls."""
    parsed = parser(text)
    if parsed is None:
        return None
    content, calls = parsed
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]
    return content, tool_calls


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to its first stop string (OpenAI leaves the stop string out) and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)
