"""Agents written against the OpenAI API, played for training (design: "Agents written against the OpenAI API
can be trained too").

A user's agent is a function `run(client, row)`: async with an `openai.AsyncOpenAI` client, or plain with an
`openai.OpenAI` one. The client points at the run's own endpoint (`ascent.rollout.server`) and sends a session
header, so every call the agent makes is recorded under its episode. `run` returns the episode's reward, or
None to have the run's reward function score the last reply. It is named by import path
(`rollout.agent=pkg.module:run`) and runs in agent processes (`play` is what a process runs: one chunk of
episodes at once on an asyncio loop, each bounded by its timeout), so an agent that raises, hangs or kills its
process costs its episodes, never the run.

Imports: openai (lazily, in the agent process), `ascent.errors`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ascent.errors import AscentError
from ascent.plugins import PluginError, load_plugin

SESSION_HEADER = "X-Session-Id"


class AgentLoadError(AscentError):
    """`rollout.agent` does not name a function that can be imported."""


@dataclass(frozen=True)
class AgentSpec:
    """Where the agents play: their import path, the endpoint, its key, the model name they are told, and
    the most seconds one episode may take."""

    path: str
    url: str
    api_key: str
    model: str
    timeout_s: float


@dataclass(frozen=True)
class AgentJob:
    """One episode to play: the session its calls are recorded under and the row it is given."""

    session: str
    row: Mapping[str, Any]


@dataclass(frozen=True)
class AgentResult:
    """What one episode's `run` gave: a reward (None: score the last reply) or the error that ended it."""

    reward: float | None = None
    error: str | None = None
    seconds: float = 0.0


def load_agent(path: str) -> Callable[..., Any]:
    """The function `pkg.module:name` names; an error naming `rollout.agent` and the fix otherwise."""
    try:
        fn = load_plugin(path, "rollout.agent")
    except PluginError as err:
        raise AgentLoadError(f"{err} An agent is a function run(client, row).") from err
    return fn  # type: ignore[no-any-return]


def play(spec: AgentSpec, jobs: Sequence[AgentJob]) -> list[AgentResult]:
    """Play `jobs` concurrently (what one agent process runs for one chunk); one result per job, in order."""
    return asyncio.run(_play_all(spec, list(jobs)))


async def _play_all(spec: AgentSpec, jobs: list[AgentJob]) -> list[AgentResult]:
    fn = load_agent(spec.path)
    return list(await asyncio.gather(*(_play_one(fn, spec, job) for job in jobs)))


async def _play_one(fn: Callable[..., Any], spec: AgentSpec, job: AgentJob) -> AgentResult:
    import openai

    headers = {SESSION_HEADER: job.session}
    kw: dict[str, Any] = {
        "base_url": spec.url,
        "api_key": spec.api_key,
        "default_headers": headers,
        "timeout": spec.timeout_s,
    }
    start = time.perf_counter()
    try:
        if inspect.iscoroutinefunction(fn):
            async with openai.AsyncOpenAI(**kw) as client:
                out = await asyncio.wait_for(fn(client, dict(job.row)), spec.timeout_s)
        else:  # a plain function gets a plain client, on a thread (the process's timeout bounds a hang)
            with openai.OpenAI(**kw) as sync_client:
                call = asyncio.to_thread(fn, sync_client, dict(job.row))
                out = await asyncio.wait_for(call, spec.timeout_s)
        return AgentResult(reward=_reward(out), seconds=time.perf_counter() - start)
    except TimeoutError:
        error = f"timed out after {spec.timeout_s:g} s (rollout.agent_timeout_s)"
    except BaseException as err:  # noqa: BLE001 - user code: anything it raises costs this episode only
        error = f"{type(err).__name__}: {err}"
    return AgentResult(error=error, seconds=time.perf_counter() - start)


def _reward(out: Any) -> float | None:
    if out is None:
        return None
    if isinstance(out, bool | int | float) and math.isfinite(float(out)):
        return float(out)
    raise TypeError(
        f"run(client, row) returned {out!r}; return the episode's reward (a finite number) or None"
    )
