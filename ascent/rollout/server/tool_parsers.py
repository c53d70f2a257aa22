"""Tool calls in each model family's own format -> OpenAI `tool_calls` (`ascent.rollout.server`; `chat` uses
it).

A parser reads a reply's text (special tokens kept, the final end-of-turn token dropped) and returns its
content and calls, or None when the reply is not a well-formed set of calls (the client then gets the text
as the model wrote it). `TOOL_PARSERS` is the registry; `ascent serve --tool-parser NAME` picks one, and
`auto` (the default) picks by the markers in the tokenizer's chat template:

- `hermes` (Qwen 2/2.5/3, Hermes, and templates with `<tool_call>`):
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call, text around them is content.
- `llama3_json` (Llama 3.1-3.3, templates with `<|python_tag|>`): the whole reply is
  `{"name": ..., "parameters": {...}}` (or `"arguments"`), optionally after `<|python_tag|>`, several
  separated by `;`.
- `mistral` (templates with `[TOOL_CALLS]`): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, or the
  newer `[TOOL_CALLS]name[ARGS]{...}` per call; text before the first marker is content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ascent.envs.tools.calls import parse_tool_calls


@dataclass(frozen=True)
class ParsedCall:
    """One call the model wrote: the function's name and its arguments."""

    name: str
    arguments: dict[str, Any]


Parsed = tuple[str | None, list[ParsedCall]]  # (content, calls)
Parser = Callable[[str], Parsed | None]

_HERMES_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_DECODER = json.JSONDecoder()


def _call(obj: Any, *argument_keys: str) -> ParsedCall | None:
    """A JSON object {"name": str, <one of argument_keys>: object or JSON string} as a call; else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args: Any = next((obj[k] for k in argument_keys if k in obj), {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    return ParsedCall(obj["name"], args) if isinstance(args, dict) else None


def _json_values(text: str, separators: str) -> list[Any] | None:
    """Consecutive JSON values filling `text` (only whitespace and `separators` between them), or None."""
    out: list[Any] = []
    at = 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] in separators):
            at += 1
        if at == len(text):
            return out
        try:
            value, at = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        out.append(value)


def hermes(text: str) -> Parsed | None:
    calls, errors = parse_tool_calls(text)
    if not calls or errors:
        return None
    content = _HERMES_BLOCK.sub("", text).strip()
    return content or None, [ParsedCall(c.name, c.arguments) for c in calls]


def llama3_json(text: str) -> Parsed | None:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return None
    values = _json_values(body, ";")
    calls = [_call(v, "parameters", "arguments") for v in values or []]
    if not calls or any(c is None for c in calls):
        return None
    return None, [c for c in calls if c is not None]


def mistral(text: str) -> Parsed | None:
    content, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return None
    calls: list[ParsedCall | None] = []
    if rest.lstrip().startswith("["):  # [{"name": ..., "arguments": ...}, ...]
        values = _json_values(rest, "")
        items = values[0] if values and len(values) == 1 and isinstance(values[0], list) else None
        calls = [_call(v, "arguments", "parameters") for v in items or []]
    else:  # name[ARGS]{...}, each call after its own [TOOL_CALLS]
        for part in rest.split("[TOOL_CALLS]"):
            name, args_marker, args = part.partition("[ARGS]")
            values = _json_values(args, "") if args_marker else None
            if values is None or len(values) != 1:
                return None
            calls.append(_call({"name": name.strip(), "arguments": values[0]}, "arguments"))
    if not calls or any(c is None for c in calls):
        return None
    return content.strip() or None, [c for c in calls if c is not None]


TOOL_PARSERS: dict[str, Parser] = {"hermes": hermes, "llama3_json": llama3_json, "mistral": mistral}

# chat-template marker -> parser, checked in this order; a template with none of them gets `hermes`
TEMPLATE_MARKERS = (("[TOOL_CALLS]", "mistral"), ("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"))
DEFAULT_PARSER = "hermes"


def detect_tool_parser(chat_template: Any) -> str:
    """The parser for a tokenizer's chat template (a string, or a dict of named templates)."""
    text = " ".join(chat_template.values()) if isinstance(chat_template, dict) else str(chat_template or "")
    return next((name for marker, name in TEMPLATE_MARKERS if marker in text), DEFAULT_PARSER)


def tool_parser(name: str, tokenizer: Any) -> tuple[str, Parser]:
    """(name, parser) for `name` ("auto": from the tokenizer's chat template); ValueError for an unknown
    one."""
    if name == "auto":
        name = detect_tool_parser(getattr(tokenizer, "chat_template", None))
    if name not in TOOL_PARSERS:
        raise ValueError(f"--tool-parser {name}: unknown; use auto or one of {', '.join(TOOL_PARSERS)}.")
    return name, TOOL_PARSERS[name]
