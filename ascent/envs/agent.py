"""Agent tasks with tools: `ToolEnv` gives the model functions to call in its native `<tool_call>` format; a
turn with no tool call is the final answer, scored against the row. `python_math` is the built-in one: a
question whose answer is a number, and a sandboxed Python interpreter to compute it.

Tool results go back as `tool` messages (the chat template wraps them as the model was trained to read
them); a malformed call, an unknown tool or a failing one is answered with the error, so the model can retry.
Scorers: `last_number_matches` (the last number of the answer) and `answer_matches` (an `<answer>` tag or the
whole turn against the row's answer: numbers numerically, text normalised), both reading the answer from
`answer` or SkyRL's `reward_spec.ground_truth` (`ascent.envs.rows.row_answer`). The data tasks built on
`ToolEnv` (`text_to_sql`, `search_qa`) live in `ascent.envs.tasks`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ascent.envs.base import Message, StepResult
from ascent.envs.rows import row_answer, row_messages
from ascent.envs.tools import FunctionTool, Limits, ToolResult, function_tool, parse_tool_calls, run_python

Score = Callable[[str, Mapping[str, Any]], float]
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class ToolEnv:
    """`tools` the model may call; `score(final_answer, row)` rewards the turn that calls none."""

    def __init__(self, tools: Sequence[FunctionTool], score: Score, system: str | None = None) -> None:
        self.by_name = {t.name: t for t in tools}
        self.tools = [t.schema for t in tools]  # what ChatTokens renders into the prompt (`tools=`)
        self.score, self.system = score, system

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        """The row's prompt (a string, or chat messages as SkyRL's rows hold them), after `system_prompt(row)`
        unless the prompt brings its own system message."""
        self.row = row
        messages: list[Message] = [*row_messages(row)]
        system = self.system_prompt(row)
        if system and not (messages and messages[0]["role"] == "system"):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def system_prompt(self, row: Mapping[str, Any]) -> str | None:
        """The system message of `row`'s episode (subclasses add what the row's data says, e.g. a schema)."""
        return self.system

    def step(self, action: str) -> StepResult:
        calls, errors = parse_tool_calls(action)
        if not calls and not errors:
            return StepResult(reward=float(self.score(action, self.row)), done=True)
        results = [self._call(c.name, c.arguments).text() for c in calls] + [f"[error] {e}" for e in errors]
        info = {"tool_calls": len(results)}  # a malformed call is a call too (answered with its error)
        return StepResult(tuple({"role": "tool", "content": r} for r in results), info=info)

    def _call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        tool = self.by_name.get(name)
        if tool is None:
            return ToolResult(False, "", f"no tool {name!r}; the tools are {', '.join(sorted(self.by_name))}")
        return tool.call(arguments)


def python(code: str) -> ToolResult:
    """Run Python code and return what it prints (no network, 5 s of CPU, 512 MiB)."""
    return run_python(code, Limits(timeout_s=10, cpu_s=5))


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands commas ignored), or None."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def last_number_matches(answer: str, row: Mapping[str, Any]) -> float:
    """1 when the last number in the answer equals the row's answer (`row_answer`), else 0."""
    found = last_number(answer)
    return float(found is not None and found == float(row_answer(row)))


def final_answer(text: str) -> str:
    """What a final turn answers: the inside of its last `<answer>...</answer>`, else the whole turn."""
    tagged = _ANSWER.findall(text)
    return (tagged[-1] if tagged else text).strip()


def normalise(text: str) -> str:
    """Lower case, without punctuation, articles (a, an, the) and extra spaces (SQuAD's exact match)."""
    words = "".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split()
    return " ".join(w for w in words if w not in ("a", "an", "the"))


def answer_matches(answer: str, row: Mapping[str, Any]) -> float:
    """1 when the final answer (`final_answer`) matches the row's answer, else 0. A number (or a numeric
    string) is compared with the last number of the answer, within a relative 1e-6; any other value by its
    normalised text (`normalise`). A list of answers (or SkyRL's `{"target": [...]}`) accepts any of them."""
    expected = row_answer(row)
    if isinstance(expected, Mapping) and "target" in expected:
        expected = expected["target"]
    options = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    got = final_answer(answer)
    return float(any(_matches(got, option) for option in options))


def _matches(got: str, expected: Any) -> bool:
    number = _as_number(expected)
    if number is not None:
        found = last_number(got)
        return found is not None and math.isclose(found, number, rel_tol=1e-6, abs_tol=1e-9)
    return normalise(got) == normalise(str(expected))


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).replace(",", "").strip())
    except ValueError:
        return None


def python_math() -> ToolEnv:
    return ToolEnv(
        [function_tool(python)],
        last_number_matches,
        system="Use the python tool to compute; then answer with the number alone.",
    )
