"""Agents written against the OpenAI API, played for training (design: "Agents written against the OpenAI API
can be trained too").

A user's agent is a function `run(client, row)`: async with an `openai.AsyncOpenAI` client, or plain with an
`openai.OpenAI` one. The client points at the run's own endpoint (`ascent.rollout.server`) and sends a session
header, so every call the agent makes is recorded under its episode. `run` returns the episode's reward, or
None to have the run's reward function score the last reply. It is named by import path
(`rollout.source={name: agent, agent: pkg.module:run}`) and runs in agent processes (`play` is what a process
runs: one chunk of episodes at once on an asyncio loop, each bounded by its timeout, a `LoopWatchdog` stopping
an agent that blocks the loop; a plain agent runs on a daemon thread of its own, so one that hangs is left
behind, not waited for), so an agent that raises, hangs or kills its process costs its episodes, never the
run.

An episode that outgrows its budget is the policy's doing, not the agent's: the endpoint answers a call whose
prompt and `max_tokens` pass the run's context (`data.max_prompt_tokens + rollout.source.max_episode_tokens`)
with the 400 `context_length_exceeded` that OpenAI answers, which a real agent raises on. Each client watches
its responses for that answer (`BudgetWatch`, an httpx response hook), so the result says the episode was
truncated, with whatever the agent did next (raised: reward 0; returned: its reward), never an error.

Imports: openai (lazily, in the agent process), httpx (through openai), `ascent.errors`,
`ascent.envs.watchdog`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ascent.envs.watchdog import LoopWatchdog
from ascent.errors import AscentError
from ascent.plugins import PluginError, load_plugin

SESSION_HEADER = "X-Session-Id"
BUDGET_CODE = "context_length_exceeded"  # the endpoint's (and OpenAI's) 400 for a call past the context


class AgentLoadError(AscentError):
    """`rollout.source.agent` does not name a function that can be imported."""


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
    """What one episode's `run` gave: a reward (None: score the last reply) or the error that ended it;
    `truncated`: the endpoint's answer to the call that passed the episode's budget (then never an error)."""

    reward: float | None = None
    error: str | None = None
    seconds: float = 0.0
    truncated: str | None = None


class BudgetWatch:
    """An httpx response hook on one episode's client: keeps the message of the endpoint's
    `context_length_exceeded` answer, however the agent handles the exception it raises."""

    def __init__(self) -> None:
        self.refused: str | None = None

    def seen(self, response: Any) -> None:
        if response.status_code != 400:
            return
        response.read()
        self._note(response)

    async def seen_async(self, response: Any) -> None:
        if response.status_code != 400:
            return
        await response.aread()
        self._note(response)

    def _note(self, response: Any) -> None:
        try:
            error = response.json().get("error") or {}
        except (ValueError, AttributeError):
            return
        if isinstance(error, dict) and error.get("code") == BUDGET_CODE:
            self.refused = str(error.get("message"))


def load_agent(path: str) -> Callable[..., Any]:
    """The function `pkg.module:name` names; an error naming `rollout.source.agent` and the fix otherwise."""
    try:
        fn = load_plugin(path, "rollout.source.agent")
    except PluginError as err:
        raise AgentLoadError(f"{err} An agent is a function run(client, row).") from err
    return fn  # type: ignore[no-any-return]


def play(spec: AgentSpec, jobs: Sequence[AgentJob]) -> list[AgentResult]:
    """Play `jobs` concurrently (what one agent process runs for one chunk); one result per job, in order."""
    fn = load_agent(spec.path)
    with LoopWatchdog(spec.timeout_s) as dog:
        return asyncio.run(_play_all(fn, spec, list(jobs), dog))


async def _play_all(
    fn: Callable[..., Any], spec: AgentSpec, jobs: list[AgentJob], dog: LoopWatchdog
) -> list[AgentResult]:
    beat = asyncio.ensure_future(dog.beat())
    try:
        return list(await asyncio.gather(*(_play_one(fn, spec, job, dog) for job in jobs)))
    finally:
        beat.cancel()


async def _play_one(fn: Callable[..., Any], spec: AgentSpec, job: AgentJob, dog: LoopWatchdog) -> AgentResult:
    import openai  # deferred: openai, only for agents

    watch = BudgetWatch()
    kw: dict[str, Any] = {
        "base_url": spec.url,
        "api_key": spec.api_key,
        "default_headers": {SESSION_HEADER: job.session},
        "timeout": spec.timeout_s,
    }
    start = time.perf_counter()
    dog.opened(job.session)
    try:
        if inspect.iscoroutinefunction(fn):
            http = openai.DefaultAsyncHttpxClient(event_hooks={"response": [watch.seen_async]})
            async with openai.AsyncOpenAI(**kw, http_client=http) as client:
                out = await asyncio.wait_for(fn(client, dict(job.row)), spec.timeout_s)
        else:  # a plain function gets a plain client, on a thread of its own (a hang is left behind)
            sync_http = openai.DefaultHttpxClient(event_hooks={"response": [watch.seen]})
            with openai.OpenAI(**kw, http_client=sync_http) as sync_client:
                out = await asyncio.wait_for(_on_thread(fn, sync_client, dict(job.row)), spec.timeout_s)
        reward, error = _reward(out), None
    except TimeoutError:
        reward, error = None, f"timed out after {spec.timeout_s:g} s (rollout.source.timeout_s)"
    except BaseException as err:  # noqa: BLE001 - user code: anything it raises costs this episode only
        reward, error = None, f"{type(err).__name__}: {err}"
    finally:
        dog.closed(job.session)
    seconds = time.perf_counter() - start
    if watch.refused is not None:  # the policy outgrew the budget: whatever the agent did next, truncated
        return AgentResult(reward=0.0 if error else reward, seconds=seconds, truncated=watch.refused)
    return AgentResult(reward=reward, error=error, seconds=seconds)


async def _on_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) on a daemon thread (not the loop's executor, which `asyncio.run` waits for at its end)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, err: BaseException | None) -> None:
        if not done.done():
            done.set_exception(err) if err is not None else done.set_result(value)

    def target() -> None:
        try:
            value, err = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the episode, which reports it
            value, err = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed: the episode already timed out
            loop.call_soon_threadsafe(settle, value, err)

    threading.Thread(target=target, name="ascent-agent", daemon=True).start()
    return await done


def _reward(out: Any) -> float | None:
    if out is None:
        return None
    if isinstance(out, bool | int | float) and math.isfinite(float(out)):
        return float(out)
    raise TypeError(
        f"run(client, row) returned {out!r}; return the episode's reward (a finite number) or None"
    )
