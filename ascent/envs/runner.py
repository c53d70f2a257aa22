"""Multi-turn episodes, tokens in and tokens out: the runner drives an engine and environments turn by turn.

Each turn, every open episode sends its whole token sequence so far (prompt, model turns, observations) as
one request with the episode's own session id (`row<row_id>.<task index>`: the samples of one row are
different conversations) and its task index as request_id (the same every turn, so a caller spreading
requests over replicas can keep an episode on one); the engine answers with the next model turn. An engine
that keeps sessions (the fast engine) computes only the tokens after what it cached of the episode, i.e. the
observation; the episode's metadata counts `prompt_tokens` sent and `cached_tokens` reused over its turns.
A turn that ended on a stop token goes to the environment as text; its answer (observation messages) is
appended as the token ids with which the chat template continues the conversation
(`ChatTokens.continuation_ids`), never by re-rendering the history, so what the trainer sees is exactly what
the engine generated plus the observation ids. Model tokens have loss mask 1, the sampler's logprobs and
their policy versions; observation tokens have mask 0.

An episode ends when the environment says done, at `max_turns` model turns, when its response (model and
observation tokens) would pass `max_tokens`, when a turn stops without a stop token (cut by length), or when
the environment fails (raises; answers with something that is not a valid `StepResult`: a reward that is
None, not a number, NaN or infinite, `done` not a bool, an observation that is not a list of messages,
`info` not a dict; or, in a host of `ascent.envs.hosts`, a process or a Ray actor, hangs or dies): that
costs the episode (finish "abort", reward 0, the reason in its metadata's `env_error`, counted by the
loop's env/errors like any environment failure), never the batch. The episode's reward is the sum of its
turns' rewards (`metadata["turn_rewards"]` keeps them; token-level estimators place each on the last token
of its turn: orchestrator.batch.advantage_inputs). `metadata["tool_calls"]` sums the tool calls its turns
reported (`info["tool_calls"]`; a value that is not a whole number >= 0 breaks the contract like a bad reward).
A simulator's `info["success"]` and `info["episode_length"]` (`ascent.envs.sim`) are kept from its latest turn
in the episode's metadata (the loop's env/success_rate and env/episode_length); other environments add none.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ascent.envs.base import Environment, Message, StepResult, make_env
from ascent.envs.chat import ChatTokens
from ascent.envs.hosts import HostedEnvs, Hosts, InProcessEnvs
from ascent.errors import AscentError
from ascent.messages import Episode, FinishReason, Generation, GenerationRequest, SamplingParams

log = logging.getLogger("ascent.envs")

Generate = Callable[[list[GenerationRequest]], list[list[Generation]]]
OUTCOME_KEYS = ("success", "episode_length")  # info keys an episode's metadata keeps from its latest turn


@dataclass(frozen=True)
class Task:
    """One episode to run: a fresh environment, the row it resets from, the row's id."""

    env: Environment | str  # an instance, or a name / import path made where it runs (a host process)
    row: Mapping[str, Any]
    row_id: int


@dataclass
class _Open:
    """An episode being built (internal: the runner's own mutable state; it returns frozen Episodes)."""

    task: Task
    prompt_ids: list[int]
    index: int  # the task's position: the request_id of every turn (a caller keeps it on one replica)
    session: str  # the engine's session id: one per episode, so each continues its own cached history
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0  # summed over the turns' info["tool_calls"]
    outcome: dict[str, Any] = field(default_factory=dict)  # OUTCOME_KEYS of the latest turn's info
    prompt_tokens: int = 0  # tokens sent to the engine as prompts, over all turns
    cached_tokens: int = 0  # of those, tokens whose K/V the engine reused from the episode's session
    finish: FinishReason | None = None
    error: str | None = None

    def add_model_turn(self, gen: Generation, version: int) -> None:
        self.prompt_tokens += len(self.prompt_ids) + len(self.ids)  # what this turn's request sent
        self.cached_tokens += gen.cached_tokens
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.logprobs += gen.logprobs
        self.versions += gen.token_versions or [version] * len(gen.token_ids)
        self.turns += 1

    def add_observation(self, ids: list[int]) -> None:
        last = self.versions[-1] if self.versions else 0  # not sampled: the version of the turn before
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [last] * len(ids)

    def episode(self, decode: Callable[[Sequence[int]], str]) -> Episode:
        failed = self.error is not None
        meta = {
            **self.task.row,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "turn_rewards": list(self.turn_rewards),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            **self.outcome,
        }
        return Episode(
            prompt_ids=self.prompt_ids,
            response_ids=self.ids,
            sampler_logprobs=self.logprobs,
            loss_mask=self.mask,
            finish_reason=self.finish or "length",
            row_id=self.task.row_id,
            policy_version=min(self.versions, default=0),
            token_versions=self.versions,
            reward=0.0 if failed else sum(self.turn_rewards),
            response_text=decode(self.ids),
            metadata=meta | ({"env_error": self.error} if failed else {}),
        )


def run_episodes(
    tasks: Sequence[Task],
    generate: Generate,
    chat: ChatTokens,
    params: SamplingParams,
    *,
    max_turns: int,
    max_tokens: int,
    version: int = 0,
    hosts: Hosts | None = None,
    envs: BatchEnvs | None = None,
) -> list[Episode]:
    """Run every task's episode to its end, all open episodes batched into one engine call per turn.

    `params` sample each turn (`n` is taken as 1, `max_new_tokens` capped by what is left of `max_tokens`;
    request i of turn t gets seed `params.seed + 1000 * t + i` when a seed is set). `version`: the policy
    version stamped on tokens the engine returns without one. `hosts`: run the environments there (host
    processes or Ray actors; tasks then name their environment), else in this process. `envs`: a batch view
    of the tasks' environments to use instead (`reset(rows)`, `step(calls)`, `close()`, like
    `InProcessEnvs`; e.g. `ascent.envs.sim.SimVectorEnvs`, which steps simulators together)."""
    envs = envs if envs is not None else _envs(tasks, hosts)
    try:
        resets = envs.reset([t.row for t in tasks])
        open_ = [
            _Open(t, chat.prompt_ids(*started(t, out)), k, f"row{t.row_id}.{k}")
            for k, (t, out) in enumerate(zip(tasks, resets, strict=True))
        ]
        for turn in range(max_turns):
            active = [(k, s) for k, s in enumerate(open_) if s.finish is None]
            if not active:
                break
            requests = [_request(s, params, max_tokens, turn, i) for i, (_, s) in enumerate(active)]
            to_step = []
            for (k, s), (gen, *_) in zip(active, generate(requests), strict=True):
                s.add_model_turn(gen, version)
                if gen.finish_reason == "stop":
                    to_step.append((k, chat.decode(gen.token_ids)))
                else:  # cut by the token budget: the turn is unfinished, so is the episode
                    s.finish = gen.finish_reason
            last = turn == max_turns - 1  # no observation after the last turn: nobody would answer it
            for (k, _), result in zip(to_step, envs.step(to_step), strict=True):
                _answer(open_[k], result, chat, 0 if last else max_tokens)
        return [s.episode(chat.decode) for s in open_]
    finally:
        envs.close()  # hosts that outlive the batch (Ray actors) drop its environments


class BatchEnvs(Protocol):
    """A batch's environments as the runner drives them (`InProcessEnvs`, `HostedEnvs`,
    `ascent.envs.sim.SimVectorEnvs`): one reset per row, steps by batch index; a failure is its text."""

    def reset(self, rows: Sequence[Any]) -> list[tuple[list[Message], Any] | str]: ...

    def step(self, calls: Sequence[tuple[int, str]]) -> list[StepResult | str]: ...

    def close(self) -> None: ...


def _envs(tasks: Sequence[Task], hosts: Hosts | None) -> InProcessEnvs | HostedEnvs:
    if hosts is None:
        return InProcessEnvs([make_env(t.env) if isinstance(t.env, str) else t.env for t in tasks])
    if not all(isinstance(t.env, str) for t in tasks):
        raise TypeError("run_episodes(hosts=...): each Task must name its environment (a str), not hold one")
    return HostedEnvs(hosts, [str(t.env) for t in tasks])


class EnvResetError(AscentError):
    """An environment refused a row at reset (most often a missing or malformed column)."""


def started(t: Task, out: tuple[list[Message], Any] | str) -> tuple[list[Message], Any]:
    if isinstance(out, str):
        name = t.env if isinstance(t.env, str) else type(t.env).__name__
        raise EnvResetError(
            f"row {t.row_id + 1}: {name}.reset failed ({out}); the row has fields {sorted(t.row)}. Fix the "
            "row or the environment (`ascent debug env` runs it where breakpoint() works)."
        )
    return out


def _request(s: _Open, params: SamplingParams, max_tokens: int, turn: int, i: int) -> GenerationRequest:
    left = max(1, max_tokens - len(s.ids))
    seed = None if params.seed is None else params.seed + 1000 * turn + i
    turn_params = replace(params, n=1, max_new_tokens=min(params.max_new_tokens, left), seed=seed)
    return GenerationRequest(s.prompt_ids + s.ids, turn_params, request_id=s.index, session_id=s.session)


def _answer(s: _Open, result: StepResult | str, chat: ChatTokens, max_tokens: int) -> None:
    """The environment's answer to the turn just added: end the episode, or append the observation."""
    try:
        if isinstance(result, str):  # it raised, hung or died where it runs: `result` says how
            raise _EnvFailed(result)
        reward = checked_step(result)
        observation = [] if result.done else chat.continuation_ids(result.observation)
    except Exception as e:  # user code (or its process): it costs this episode, never the batch
        s.finish, s.error = "abort", str(e) if isinstance(e, _EnvFailed) else f"{type(e).__name__}: {e}"
        log.warning("environment failed on row %d turn %d: %s", s.task.row_id + 1, s.turns, s.error)
        return
    s.turn_rewards.append(reward)
    s.tool_calls += int(result.info.get("tool_calls", 0))
    s.outcome |= {k: result.info[k] for k in OUTCOME_KEYS if k in result.info}
    if result.done:
        s.finish = "stop"
    elif len(s.ids) + len(observation) >= max_tokens:  # out of tokens (or of turns: max_tokens=0)
        s.finish = "length"
    else:
        s.add_observation(observation)


class _EnvFailed(Exception):
    """The environment's own failure, as its host reported it (the text is the reason, kept as is)."""


class StepResultError(ValueError):
    """An environment's `step` answered with something that breaks the `StepResult` contract."""


def checked_step(result: Any) -> float:
    """`result`'s reward as a finite float, after checking every field of the `StepResult` contract; raises
    StepResultError naming the field, its value and what it should be."""
    if not isinstance(result, StepResult):
        raise StepResultError(
            f"step returned {_quote(result)}, not a StepResult(observation, reward, done, info)"
        )
    reward, done = _number(result.reward), result.done
    if reward is None or not math.isfinite(reward):
        raise StepResultError(
            f"step returned reward={_quote(result.reward)}; it must be a finite number (a float)"
        )
    if type(done).__name__ not in ("bool", "bool_"):  # Python's, or numpy's (named bool_ before numpy 2)
        raise StepResultError(f"step returned done={_quote(done)}; it must be True or False")
    obs = result.observation
    if not isinstance(obs, (list, tuple)) or not all(isinstance(m, Mapping) and "role" in m for m in obs):
        raise StepResultError(
            f"step returned observation={_quote(obs)}; it must be a tuple of messages ({{'role', 'content'}})"
        )
    if not isinstance(result.info, Mapping):
        raise StepResultError(f"step returned info={_quote(result.info)}; it must be a dict")
    calls = result.info.get("tool_calls", 0)
    if isinstance(calls, bool) or not hasattr(calls, "__index__") or calls < 0:  # numpy's ints count
        raise StepResultError(
            f"step returned info['tool_calls']={_quote(calls)}; it must be a whole number >= 0 (the tool "
            "calls the turn made)"
        )
    return reward


def _number(value: Any) -> float | None:
    """`value` as a float when it is a number (numpy's and torch's scalars too), else None."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):  # e.g. an array of several numbers
        return None


def _quote(value: Any) -> str:
    text = repr(value)
    return f"{text[:80]}..." if len(text) > 80 else f"{text} ({type(value).__name__})"
