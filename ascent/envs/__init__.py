"""Environments and multi-turn episodes (design: "Environments and tools").

`base`: the `Environment` protocol (`reset(row)`, `step(action) -> StepResult`), the registry
(`ENVIRONMENTS`, `make_env`) and a built-in game; `runner`: `run_episodes` drives an engine and environments
turn by turn into `Episode`s, tokens in and tokens out. Not yet wired into `ascent train` (issue #13).
"""

from ascent.envs.base import ENVIRONMENTS, Environment, GuessNumber, StepResult, make_env
from ascent.envs.runner import ChatTokens, Task, run_episodes

__all__ = [
    "ENVIRONMENTS",
    "ChatTokens",
    "Environment",
    "GuessNumber",
    "StepResult",
    "Task",
    "make_env",
    "run_episodes",
]
