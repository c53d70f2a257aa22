"""The environment API (design: "Environments and tools"): what an agent's world looks like to the loop.

An environment is a small class with two methods. `reset(row)` takes one dataset row and returns the
conversation the model starts from (chat messages). `step(action)` takes the text of one model turn and
returns a `StepResult`: the messages the world answers with (a tool's output, a game's feedback), the reward
of that turn, and whether the episode is over. The runner (`ascent.envs.runner`) turns the messages into
token ids and drives the engine; an environment never sees or produces tokens.

An environment may also have a `tools` attribute (function schemas, `ascent.envs.tools.function_tool`): the
runner passes it to the chat template, which describes the tools to the model (`ascent.envs.agent.ToolEnv`).

`ENVIRONMENTS` maps names to factories (`guess_number`, `python_math`); `make_env(name)` also takes an import
path `pkg.module:Class`.
Only `ascent.errors` is imported from ascent (design: envs import only messages and errors).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ascent.errors import AscentError

Message = Mapping[str, str]  # {"role": "user" | "tool" | ..., "content": "..."}


@dataclass(frozen=True)
class StepResult:
    """What the world answers one model turn with. `observation` is appended to the conversation (empty when
    `done`); `reward` is this turn's (an episode's reward is the sum of its turns')."""

    observation: tuple[Message, ...] = ()
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        """The conversation of this episode before the model's first turn (system/user messages)."""
        ...

    def step(self, action: str) -> StepResult:
        """Answer the model's turn `action` (its text, special tokens removed)."""
        ...


class GuessNumber:
    """A multi-turn game with feedback: guess the row's `target` (an integer); each wrong guess is answered
    "higher" or "lower" (or "not a number"); a right guess earns 1 and ends the episode."""

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        self.target = int(row["target"])
        low, high = row.get("low", 0), row.get("high", 9)
        return [{"role": "user", "content": f"Guess my number from {low} to {high}."}]

    def step(self, action: str) -> StepResult:
        text = action.strip()
        if not text.lstrip("-").isdigit():
            return StepResult(({"role": "user", "content": "not a number"},))
        guess = int(text)
        if guess == self.target:
            return StepResult(reward=1.0, done=True)
        hint = "higher" if guess < self.target else "lower"
        return StepResult(({"role": "user", "content": hint},))


def _python_math() -> Environment:
    from ascent.envs.agent import python_math  # tools import pydantic: only when asked for

    return python_math()


ENVIRONMENTS: dict[str, Callable[[], Environment]] = {
    "guess_number": GuessNumber,
    "python_math": _python_math,
}


class EnvNotFoundError(AscentError):
    """An environment name or import path that does not resolve."""


def make_env(name_or_import_path: str) -> Environment:
    """A fresh environment: a registered name, or `pkg.module:Class` (any zero-argument callable)."""
    factory = ENVIRONMENTS.get(name_or_import_path)
    if factory is None:
        if ":" not in name_or_import_path:
            raise EnvNotFoundError(
                f"env {name_or_import_path!r} is not registered; choose one of {', '.join(sorted(ENVIRONMENTS))} "
                "or give an import path `pkg.module:Class`."
            )
        module, _, attr = name_or_import_path.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise EnvNotFoundError(
                f"env {name_or_import_path!r}: cannot load it ({type(e).__name__}: {e})."
            ) from e
    return factory()
