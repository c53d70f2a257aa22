"""Environments and multi-turn episodes (design: "Environments and tools").

`base`: the `Environment` protocol (`reset(row)`, `step(action) -> StepResult`), the registry
(`ENVIRONMENTS`, `make_env`) and a built-in game; `rows`: what environments read from a row, in ascent's shape
or SkyRL-gym's (`row_env`, `row_answer`); `runner`: `run_episodes` drives an engine and environments turn by
turn into `Episode`s, tokens in and tokens out; `images`: pictures in messages as content parts, and the
encoder protocol through which the runner turns them into image tokens; `agent`: `ToolEnv` and its scorers;
`image_env`: questions about images with tools that return images (`zoom_qa`, `image_qa`); `tasks`: built-in
tasks whose data the project generates (`text_to_sql`, `search_qa`, `zoom_qa`, rows for `guess_number`).
"""

from ascent.envs.base import ENVIRONMENTS, Environment, GuessNumber, StepResult, make_env
from ascent.envs.chat import ChatTokens
from ascent.envs.rows import row_answer, row_env, row_field, row_messages
from ascent.envs.runner import Task, run_episodes

__all__ = [
    "ENVIRONMENTS",
    "ChatTokens",
    "Environment",
    "GuessNumber",
    "StepResult",
    "Task",
    "make_env",
    "row_answer",
    "row_env",
    "row_field",
    "row_messages",
    "run_episodes",
]
