"""Agent tasks with tools: `ToolEnv` gives the model functions to call in its native `<tool_call>` format; a
turn with no tool call is the final answer, scored against the row. `python_math` is the built-in one: a
question whose answer is a number, and a sandboxed Python interpreter to compute it.

Tool results go back as `tool` messages (the chat template wraps them as the model was trained to read
them); a malformed call, an unknown tool or a failing one is answered with the error, so the model can retry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ascent.envs.base import Message, StepResult
from ascent.envs.tools import FunctionTool, Limits, ToolResult, function_tool, parse_tool_calls, run_python

Score = Callable[[str, Mapping[str, Any]], float]


class ToolEnv:
    """`tools` the model may call; `score(final_answer, row)` rewards the turn that calls none."""

    def __init__(self, tools: Sequence[FunctionTool], score: Score, system: str | None = None) -> None:
        self.by_name = {t.name: t for t in tools}
        self.tools = [t.schema for t in tools]  # what ChatTokens renders into the prompt (`tools=`)
        self.score, self.system = score, system

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        self.row = row
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": str(row["prompt"])}]

    def step(self, action: str) -> StepResult:
        calls, errors = parse_tool_calls(action)
        if not calls and not errors:
            return StepResult(reward=float(self.score(action, self.row)), done=True)
        results = [self._call(c.name, c.arguments).text() for c in calls] + [f"[error] {e}" for e in errors]
        return StepResult(tuple({"role": "tool", "content": r} for r in results))

    def _call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        tool = self.by_name.get(name)
        if tool is None:
            return ToolResult(False, "", f"no tool {name!r}; the tools are {', '.join(sorted(self.by_name))}")
        return tool.call(arguments)


def python(code: str) -> ToolResult:
    """Run Python code and return what it prints (no network, 5 s of CPU, 512 MiB)."""
    return run_python(code, Limits(timeout_s=10, cpu_s=5))


def last_number_matches(answer: str, row: Mapping[str, Any]) -> float:
    """1 when the last number in the answer equals the row's `answer`, else 0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", answer.replace(",", ""))
    return float(bool(numbers) and float(numbers[-1]) == float(row["answer"]))


def python_math() -> ToolEnv:
    return ToolEnv(
        [function_tool(python)],
        last_number_matches,
        system="Use the python tool to compute; then answer with the number alone.",
    )
