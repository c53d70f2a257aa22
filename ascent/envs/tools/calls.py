"""Tools as plain Python functions, and the model's tool calls in its native format.

`function_tool(fn)` turns a typed function into a tool: its JSON schema (name, the docstring's first
paragraph, parameters from the signature through pydantic) is what the chat template's `tools=` renders
into the prompt, and `call(arguments)` validates the model's arguments against the signature before calling,
so a wrong type is an answer for the model, not an exception. `parse_tool_calls(text)` reads Qwen-style
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; a block that is not valid JSON comes back
as an error the model sees.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ascent.envs.tools.python import ToolResult

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class FunctionTool:
    """A Python function the model may call; `schema` is the OpenAI-style function spec."""

    fn: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.schema["function"]["name"])

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        # deferred: pydantic, only for typed tool arguments
        from pydantic import ValidationError, validate_call

        try:
            out = validate_call(self.fn)(**arguments)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            return ToolResult(False, "", f"bad arguments for {self.name}: {problems}")
        except Exception as e:  # the tool's own failure is the model's observation
            return ToolResult(False, "", f"{type(e).__name__}: {e}")
        if isinstance(out, ToolResult):
            return out
        return ToolResult(True, out if isinstance(out, str) else json.dumps(out, default=str))


def function_tool(fn: Callable[..., Any]) -> FunctionTool:
    """A tool from a function with type hints; the docstring's first paragraph describes it."""
    from pydantic import create_model  # deferred: pydantic, only for typed tool arguments

    fields: dict[str, Any] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described to the model")
        annotation = Any if p.annotation is p.empty else p.annotation
        fields[p.name] = (annotation, ... if p.default is p.empty else p.default)
    model: Any = create_model(f"{fn.__name__}_args", **fields)
    spec: dict[str, Any] = model.model_json_schema()
    spec.pop("title", None)
    for prop in spec.get("properties", {}).values():
        prop.pop("title", None)
    doc = inspect.getdoc(fn) or fn.__name__
    description = doc.split("\n\n")[0].replace("\n", " ")
    schema = {
        "type": "function",
        "function": {"name": fn.__name__, "description": description, "parameters": spec},
    }
    return FunctionTool(fn, schema)


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[str]]:
    """The `<tool_call>` blocks of a model turn -> (calls, errors for the blocks that are not valid calls)."""
    calls, errors = [], []
    for block in _CALL.findall(text):
        try:
            obj = json.loads(block)
            name, args = obj["name"], obj.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(name, str) or not isinstance(args, dict):
                raise TypeError("name must be a string and arguments an object")
            calls.append(ToolCall(name, args))
        except (ValueError, KeyError, TypeError) as e:
            errors.append(f"could not read the tool call {block[:80]!r}: {type(e).__name__}: {e}")
    return calls, errors
