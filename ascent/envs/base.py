"""The environment API (design: "Environments and tools"): what an agent's world looks like to the loop.

An environment is a small class with two methods. `reset(row)` takes one dataset row and returns the
conversation the model starts from (chat messages). `step(action)` takes the text of one model turn and
returns a `StepResult`: the messages the world answers with (a tool's output, a game's feedback), the reward
of that turn, and whether the episode is over. The runner (`ascent.envs.runner`) turns the messages into
token ids and drives the engine; an environment never sees or produces tokens.

A turn that called tools says how many in `info["tool_calls"]` (a whole number >= 0); the runner sums them
into the episode's `metadata["tool_calls"]`, which group hooks read (`ascent.rewards.group_hooks`: a bonus
for tool use). `ToolEnv` reports its calls; an environment that never reports any records 0.

An environment may also have a `tools` attribute (function schemas, `ascent.envs.tools.function_tool`): the
runner passes it to the chat template, which describes the tools to the model (`ascent.envs.agent.ToolEnv`).

`ENVIRONMENTS` maps names to factories (`guess_number`, `python_math`, and the tasks of `ascent.envs.tasks`:
`text_to_sql`, `search_qa`; the image questions of `ascent.envs.image_env`: `zoom_qa`, `image_qa`; `gym`: a
gymnasium simulator, `ascent.envs.sim`); `make_env(name)` also takes an import path `pkg.module:Class`. A row
names its own environment with an `env` column (or SkyRL's `env_class`: `ascent.envs.rows.row_env`).
Only `ascent.errors` and the plug-in loader `ascent.plugins` (a leaf like errors) are imported from ascent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ascent.envs.rows import RowFieldError, row_answer, row_field
from ascent.errors import AscentError
from ascent.plugins import PluginError, load_plugin

# {"role": "user" | "tool" | ..., "content": "..."}; content may be a list of parts (`ascent.envs.images`)
Message = Mapping[str, Any]
# a model turn as an environment receives it: its text, or an action head's chunk [chunk][action_dim]
Action = str | list[list[float]]


def message_problem(message: Any) -> str | None:
    """What breaks the message contract of a reset's or an observation's message, or None: a mapping with a
    string `role` and a `content` that is a string or a list of content parts (mappings: text, images); an
    assistant message that calls tools (`tool_calls`) may leave its content out, as OpenAI's API does."""
    if not isinstance(message, Mapping):
        return f"is a {type(message).__name__}, not a message {{'role': ..., 'content': ...}}"
    if not isinstance(message.get("role"), str):
        return "has no 'role' (a string: 'user', 'tool', ...)"
    content = message.get("content")
    if isinstance(content, str) or (content is None and message.get("tool_calls")):
        return None
    if isinstance(content, list | tuple) and all(isinstance(part, Mapping) for part in content):
        return None
    kind = "no 'content'" if content is None else f"'content' of type {type(content).__name__}"
    return f"has {kind}; give it a string, or a list of content parts ({{'type': 'text', 'text': ...}})"


def first_message_problem(messages: Sequence[Any]) -> tuple[int, str] | None:
    """(index, `message_problem`) of the first message of `messages` that breaks the contract, or None."""
    for i, message in enumerate(messages):
        problem = message_problem(message)
        if problem is not None:
            return i, problem
    return None


@dataclass(frozen=True)
class StepResult:
    """What the world answers one model turn with. `observation` is appended to the conversation (empty when
    `done`); `reward` is this turn's (an episode's reward is the sum of its turns'). `info` is free-form
    except `info["tool_calls"]`: how many tool calls the turn made (see the module docstring)."""

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
    """A multi-turn game with feedback: guess the row's whole number `target` (or its `answer` /
    `reward_spec.ground_truth`) from `low` to `high` (default 0 to 9). Each turn the model guesses (the last
    integer of its turn counts); a wrong guess is answered "higher" or "lower" (where the number is, from the
    guess), a turn without a number "not a number". A right guess earns 1 and ends the episode; with the
    row's `max_guesses`, running out of guesses ends it with 0. `info` counts the guesses."""

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        self.low, self.high = int(row_field(row, "low", 0)), int(row_field(row, "high", 9))
        self.target = int(_target(row))
        if not self.low <= self.target <= self.high:
            raise ValueError(f"target {self.target} is outside low={self.low}..high={self.high}")
        limit = row_field(row, "max_guesses", None)
        self.max_guesses, self.guesses = None if limit is None else int(limit), 0
        tries = f" in {self.max_guesses} tries" if self.max_guesses else ""
        return [{"role": "user", "content": f"Guess my number from {self.low} to {self.high}{tries}."}]

    def step(self, action: str) -> StepResult:
        numbers = re.findall(r"-?\d+", action)
        if not numbers:
            return self._answer("not a number")
        self.guesses += 1
        guess = int(numbers[-1])
        if guess == self.target:
            return StepResult(reward=1.0, done=True, info={"guesses": self.guesses})
        return self._answer("higher" if guess < self.target else "lower")

    def _answer(self, hint: str) -> StepResult:
        info = {"guesses": self.guesses}
        if self.max_guesses is not None and self.guesses >= self.max_guesses:
            return StepResult(done=True, info=info)  # out of guesses: reward 0
        return StepResult(({"role": "user", "content": hint},), info=info)


def _target(row: Mapping[str, Any]) -> Any:
    try:
        return row_field(row, "target")
    except RowFieldError:
        try:
            return row_answer(row)
        except RowFieldError:
            raise RowFieldError(
                f"the row has no `target` (nor `answer`, reward_spec.ground_truth); its fields: {sorted(row)}"
            ) from None


def _lazy(import_path: str) -> Callable[[], Environment]:
    """A factory that imports `pkg.module:factory` when called (built-ins that need more than the stdlib,
    such as pydantic for tools, load only when asked for)."""

    def factory() -> Environment:
        made: Environment = load_plugin(import_path, "rollout.source.env")()
        return made

    return factory


ENVIRONMENTS: dict[str, Callable[[], Environment]] = {
    "guess_number": GuessNumber,
    "python_math": _lazy("ascent.envs.agent:python_math"),
    "text_to_sql": _lazy("ascent.envs.tasks.sql_task:TextToSql"),
    "search_qa": _lazy("ascent.envs.tasks.search_task:SearchQa"),
    "zoom_qa": _lazy("ascent.envs.image_env:zoom_qa"),
    "image_qa": _lazy("ascent.envs.image_env:image_qa"),
    "gym": _lazy("ascent.envs.sim.gym_env:GymEnv"),
}


class EnvNotFoundError(AscentError):
    """An environment name or import path that does not resolve."""


def make_env(name_or_import_path: str, field: str = "rollout.source.env") -> Environment:
    """A fresh environment: a registered name, or `pkg.module:Class` (any zero-argument callable); `field`
    names the setting in errors."""
    factory = ENVIRONMENTS.get(name_or_import_path)
    if factory is None:
        if ":" not in name_or_import_path:
            raise EnvNotFoundError(
                f"{field}={name_or_import_path!r} is not registered; choose one of "
                f"{', '.join(sorted(ENVIRONMENTS))} or give an import path `pkg.module:Class`."
            )
        try:
            factory = load_plugin(name_or_import_path, field)
        except PluginError as err:
            raise EnvNotFoundError(str(err)) from err
    return factory()
