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

Images (`ascent.envs.images`): a prompt or an observation may show pictures as content parts; with the
model's image encoder (`run_episodes(images=...)`) each becomes its run of image tokens in the ids and an
`ImageInput` in the episode's `images`, in order, and every turn's request carries all images so far. A
model turn that samples an image placeholder itself is cut before it, ending the episode (finish "abort",
`metadata["cut"]` says where): no image could stand behind that token.

An episode ends when the environment says done, at `max_turns` model turns, when its response (model and
observation tokens) would pass `max_tokens`, when a turn stops without a stop token (cut by length), or when
the environment fails (raises; answers with something that is not a valid `StepResult`: a reward that is
None, not a number, NaN or infinite, `done` not a bool, an observation that is not a list of messages
(each with a string `role` and a `content`: `ascent.envs.base.message_problem`), `info` not a dict; or,
on a host of `ascent.cluster.hosts`, a process or a Ray actor, hangs or dies): that costs the episode
(finish "abort", reward 0, the reason in its metadata's `env_error`, counted by
the loop's env/errors like any environment failure), never the batch. The episode's reward is the sum of its
turns' rewards (`metadata["turn_rewards"]` keeps them; token-level estimators place each on the last token
of its turn: orchestrator.batch.advantage_inputs). `metadata["tool_calls"]` sums the tool calls its turns
reported (`info["tool_calls"]`; a value that is not a whole number >= 0 breaks the contract like a bad reward).
Any other number in `info` is the environment's own metric: `metadata["env_info"]` keeps each one's latest
value (absent when there are none), and evaluation averages them (`ascent.orchestrator.eval_metrics`).
A simulator's `info["success"]`, `info["episode_length"]` and `info["frames"]` (its frames' files, when it
renders into a run's folder: `ascent.envs.sim`) are kept from its latest turn in the episode's metadata (the loop's env/success_rate and env/episode_length); other environments add none.

An action-head policy (`Generation.action`, `ascent.rollout.action_sampler`): a turn is one placeholder token
and its action chunk, which goes to the environment's `step` as it is (a list of `chunk` vectors) instead of
text; the episode keeps the chunks in `Episode.actions`, one per sampled token.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ascent.envs.base import Action, Environment, Message, StepResult, first_message_problem
from ascent.envs.chat import ChatTokens
from ascent.envs.hosts import HostedEnvs, Hosts, InlineHosts
from ascent.envs.images import ImageEncoder, render_with_images
from ascent.errors import AscentError
from ascent.messages import Episode, FinishReason, Generation, GenerationRequest, ImageInput, SamplingParams

log = logging.getLogger("ascent.envs")

Generate = Callable[[list[GenerationRequest]], list[list[Generation]]]
OUTCOME_KEYS = ("success", "episode_length", "frames")  # info keys the metadata keeps from the latest turn


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
    prompt_images: list[ImageInput]  # one per image-token run of prompt_ids
    index: int  # the task's position: the request_id of every turn (a caller keeps it on one replica)
    session: str  # the engine's session id: one per episode, so each continues its own cached history
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    images: list[ImageInput] = field(default_factory=list)  # the observations' images, in order
    turns: int = 0
    tool_calls: int = 0  # summed over the turns' info["tool_calls"]
    env_info: dict[str, float] = field(default_factory=dict)  # the latest value of each other number in info
    outcome: dict[str, Any] = field(default_factory=dict)  # OUTCOME_KEYS of the latest turn's info
    prompt_tokens: int = 0  # tokens sent to the engine as prompts, over all turns
    cached_tokens: int = 0  # of those, tokens whose K/V the engine reused from the episode's session
    finish: FinishReason | None = None
    error: str | None = None
    cut: str | None = None  # why a model turn was cut short (it sampled an image placeholder)
    routes: Any = None  # MoE: the sampler's experts per token of prompt_ids + ids (`_merged_routes`)
    actions: list[list[list[float]]] = field(default_factory=list)  # an action head's chunks, per turn

    def add_model_turn(self, gen: Generation, version: int) -> None:
        self.prompt_tokens += len(self.prompt_ids) + len(self.ids)  # what this turn's request sent
        self.cached_tokens += gen.cached_tokens
        self.ids += gen.token_ids
        self.mask += gen.loss_mask()
        self.logprobs += gen.logprobs
        self.versions += gen.token_versions or [version] * len(gen.token_ids)
        self.turns += 1
        if gen.action is not None:
            self.actions.append(gen.action)
        if gen.routed_experts is not None:
            self.routes = _merged_routes(self.routes, gen.routed_experts)

    def add_observation(self, ids: list[int], images: Sequence[ImageInput] = ()) -> None:
        last = self.versions[-1] if self.versions else 0  # not sampled: the version of the turn before
        self.images += images
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
        if self.cut:
            meta["cut"] = self.cut
        if self.env_info:
            meta["env_info"] = dict(self.env_info)
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
            images=(*self.prompt_images, *self.images),
            routed_experts=None
            if self.routes is None
            else self.routes[: len(self.prompt_ids) + len(self.ids)],
            actions=list(self.actions),
        )


def _merged_routes(old: Any, new: Any) -> Any:
    """An episode's experts so far (`old`, or None) and a turn's (`new`: an int tensor [request prompt + the
    turn's tokens, layers, k]) -> the episode's: each token keeps the experts of the forward that first
    computed it (an earlier turn's, which sampled what followed it), the new turn's where the earlier one
    recorded none (-1: its last sampled token; the observations after it) and for its own tokens."""
    if old is None:
        return new
    merged = new.clone()
    n = min(len(old), len(new))
    kept = old[:n, 0, 0] >= 0
    merged[:n][kept] = old[:n][kept]
    return merged


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
    images: ImageEncoder | None = None,
    envs: BatchEnvs | None = None,
) -> list[Episode]:
    """Run every task's episode to its end, all open episodes batched into one engine call per turn.

    `params` sample each turn (`n` is taken as 1, `max_new_tokens` capped by what is left of `max_tokens`;
    request i of turn t gets seed `params.seed + 1000 * t + i` when a seed is set). `version`: the policy
    version stamped on tokens the engine returns without one. `hosts`: run the environments there (host
    processes or Ray actors: tasks then name their environment), else in this process (`InlineHosts`).
    `images`: the model's image encoder (`ascent.envs.images`), which turns the images of prompts and
    observations into image tokens; None for a text model (an environment that shows images then costs its
    episodes). `envs`: a batch view of the tasks' environments to use instead (`reset(rows)`,
    `step(calls)`, `close()`, like `HostedEnvs`; e.g. `ascent.envs.sim.SimVectorEnvs`, which steps
    simulators together)."""
    envs = envs if envs is not None else _envs(tasks, hosts)
    try:
        resets = envs.reset([t.row for t in tasks])
        open_ = [
            _Open(t, *prompt_tokens(chat, images, t, out), k, f"row{t.row_id}.{k}")
            for k, (t, out) in enumerate(zip(tasks, resets, strict=True))
        ]
        for turn in range(max_turns):
            active = [(k, s) for k, s in enumerate(open_) if s.finish is None]
            if not active:
                break
            requests = [_request(s, params, max_tokens, turn, i) for i, (_, s) in enumerate(active)]
            to_step = []
            for (k, s), (gen, *_) in zip(active, generate(requests), strict=True):
                s.add_model_turn(_without_placeholders(s, gen, images), version)
                if s.finish is not None:  # it sampled an image placeholder: cut there
                    continue
                if gen.finish_reason == "stop":
                    to_step.append((k, chat.decode(gen.token_ids) if gen.action is None else gen.action))
                else:  # cut by the token budget: the turn is unfinished, so is the episode
                    s.finish = gen.finish_reason
            last = turn == max_turns - 1  # no observation after the last turn: nobody would answer it
            for (k, _), result in zip(to_step, envs.step(to_step), strict=True):
                _answer(open_[k], result, chat, images, 0 if last else max_tokens)
        return [s.episode(chat.decode) for s in open_]
    finally:
        envs.close()  # hosts that outlive the batch (Ray actors) drop its environments


class BatchEnvs(Protocol):
    """A batch's environments as the runner drives them (`HostedEnvs`, `ascent.envs.sim.SimVectorEnvs`): one
    reset per row, steps by batch index; a failure is its text."""

    def reset(self, rows: Sequence[Any]) -> list[tuple[list[Message], Any] | str]: ...

    def step(self, calls: Sequence[tuple[int, Action]]) -> list[StepResult | str]: ...

    def close(self) -> None: ...


def _envs(tasks: Sequence[Task], hosts: Hosts | None) -> HostedEnvs:
    inline = hosts is None or isinstance(hosts, InlineHosts)
    if not inline and not all(isinstance(t.env, str) for t in tasks):
        raise TypeError("run_episodes(hosts=...): each Task must name its environment (a str), not hold one")
    return HostedEnvs(InlineHosts() if hosts is None else hosts, [t.env for t in tasks])


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


def prompt_tokens(
    chat: ChatTokens, images: ImageEncoder | None, t: Task, out: tuple[list[Message], Any] | str
) -> tuple[list[int], list[ImageInput]]:
    """The episode's prompt ids (image placeholders expanded) and its images, from the environment's reset
    `out` ((messages, tools), or why it failed)."""
    messages, tools = started(t, out)
    try:
        return render_with_images(
            lambda m: chat.prompt_ids(m, tools), messages, images, f"row {t.row_id + 1}"
        )
    except Exception as e:  # an image the encoder refuses: the row's fault, named like a failed reset
        raise EnvResetError(f"row {t.row_id + 1}: its prompt's images: {type(e).__name__}: {e}") from e


def _without_placeholders(s: _Open, gen: Generation, images: ImageEncoder | None) -> Generation:
    """`gen`, cut before the first image placeholder it sampled (an image token without an image, which no
    later turn nor the trainer could feed), ending the episode; unchanged when it sampled none."""
    if images is None or images.image_token_id not in gen.token_ids:
        return gen
    cut = gen.token_ids.index(images.image_token_id)
    s.finish, s.cut = "abort", f"turn {s.turns + 1} sampled the image placeholder at token {cut}"
    versions = gen.token_versions[:cut]
    forced = gen.forced[:cut]
    return replace(
        gen,
        token_ids=gen.token_ids[:cut],
        logprobs=gen.logprobs[:cut],
        token_versions=versions,
        forced=forced,
    )


def _request(s: _Open, params: SamplingParams, max_tokens: int, turn: int, i: int) -> GenerationRequest:
    left = max(1, max_tokens - len(s.ids))
    seed = None if params.seed is None else params.seed + 1000 * turn + i
    turn_params = replace(params, n=1, max_new_tokens=min(params.max_new_tokens, left), seed=seed)
    if params.turn_grammars:  # this turn's grammar (the last one for every turn past the list)
        grammar = params.turn_grammars[min(turn, len(params.turn_grammars) - 1)]
        turn_params = replace(turn_params, grammar=grammar, turn_grammars=())
    return GenerationRequest(
        s.prompt_ids + s.ids,
        turn_params,
        request_id=s.index,
        session_id=s.session,
        images=(*s.prompt_images, *s.images),
    )


def _answer(
    s: _Open, result: StepResult | str, chat: ChatTokens, images: ImageEncoder | None, max_tokens: int
) -> None:
    """The environment's answer to the turn just added: end the episode, or append the observation (its
    images encoded and their placeholders expanded)."""
    try:
        if isinstance(result, str):  # it raised, hung or died where it runs: `result` says how
            raise _EnvFailed(result)
        reward = checked_step(result, f"{env_label(s.task.env)}.step")
        where = f"row {s.task.row_id + 1} turn {s.turns}"
        observation, pictures = (
            ([], [])
            if result.done
            else render_with_images(chat.continuation_ids, result.observation, images, where)
        )
    except Exception as e:  # user code (or its process): it costs this episode, never the batch
        s.finish, s.error = "abort", str(e) if isinstance(e, _EnvFailed) else f"{type(e).__name__}: {e}"
        who = env_label(s.task.env)
        log.warning("environment %s failed on row %d turn %d: %s", who, s.task.row_id + 1, s.turns, s.error)
        return
    s.turn_rewards.append(reward)
    s.tool_calls += int(result.info.get("tool_calls", 0))
    s.env_info |= info_numbers(result.info)
    s.outcome |= {k: result.info[k] for k in OUTCOME_KEYS if k in result.info}
    if result.done:
        s.finish = "stop"
    elif len(s.ids) + len(observation) >= max_tokens:  # out of tokens (or of turns: max_tokens=0)
        s.finish = "length"
    else:
        s.add_observation(observation, pictures)


def info_numbers(info: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a step's `info` (booleans and `tool_calls` left out), as floats."""
    return {
        str(k): float(v)
        for k, v in info.items()
        if k != "tool_calls" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class _EnvFailed(Exception):
    """The environment's own failure, as its host reported it (the text is the reason, kept as is)."""


class StepResultError(ValueError):
    """An environment's `step` answered with something that breaks the `StepResult` contract."""


def env_label(env: Environment | str) -> str:
    """How messages name an episode's environment: its name or import path, or its class."""
    return env if isinstance(env, str) else type(env).__name__


def checked_step(result: Any, step: str = "step") -> float:
    """`result`'s reward as a finite float, after checking every field of the `StepResult` contract; raises
    StepResultError naming the environment's `step` (e.g. "guess_number.step"), the field, its value and
    what it should be."""
    if not isinstance(result, StepResult):
        raise StepResultError(
            f"{step} returned {_quote(result)}, not a StepResult(observation, reward, done, info)"
        )
    reward, done = _number(result.reward), result.done
    if reward is None or not math.isfinite(reward):
        raise StepResultError(
            f"{step} returned reward={_quote(result.reward)}; it must be a finite number (a float)"
        )
    if type(done).__name__ not in ("bool", "bool_"):  # Python's, or numpy's (named bool_ before numpy 2)
        raise StepResultError(f"{step} returned done={_quote(done)}; it must be True or False")
    _check_observation(result.observation, step)
    if not isinstance(result.info, Mapping):
        raise StepResultError(f"{step} returned info={_quote(result.info)}; it must be a dict")
    calls = result.info.get("tool_calls", 0)
    if isinstance(calls, bool) or not hasattr(calls, "__index__") or calls < 0:  # numpy's ints count
        raise StepResultError(
            f"{step} returned info['tool_calls']={_quote(calls)}; it must be a whole number >= 0 (the tool "
            "calls the turn made)"
        )
    return reward


def _check_observation(obs: Any, step: str) -> None:
    """A StepResultError unless `obs` is a tuple (or list) of messages, each as `message_problem` wants."""
    if not isinstance(obs, (list, tuple)):
        raise StepResultError(
            f"{step} returned observation={_quote(obs)}; it must be a tuple of messages ({{'role', 'content'}})"
        )
    found = first_message_problem(obs)
    if found is not None:
        i, problem = found
        raise StepResultError(f"{step} returned observation[{i}]={_quote(obs[i])}, which {problem}")


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
