"""Multi-turn episodes, tokens in and tokens out: the runner drives an engine and environments turn by turn.

Each turn, every open episode sends its whole token sequence so far (prompt, model turns, observations) as
one request; the engine answers with the next model turn. A turn that ended on a stop token goes to the
environment as text; its answer (observation messages) is appended as the token ids with which the chat
template continues the conversation (`ChatTokens.continuation_ids`), never by re-rendering the history, so
what the trainer sees is exactly what the engine generated plus the observation ids. Model tokens have loss
mask 1, the sampler's logprobs and their policy versions; observation tokens have mask 0.

An episode ends when the environment says done, at `max_turns` model turns, when its response (model and
observation tokens) would pass `max_tokens`, when a turn stops without a stop token (cut by length), or when
the environment raises: that costs the episode (finish "abort", reward 0, the error in its metadata), never
the batch. The episode's reward is the sum of its turns' rewards (`metadata["turn_rewards"]` keeps them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ascent.envs.base import Environment, Message
from ascent.errors import AscentError
from ascent.messages import Episode, FinishReason, Generation, GenerationRequest, SamplingParams

log = logging.getLogger("ascent.envs")

Generate = Callable[[list[GenerationRequest]], list[list[Generation]]]

_PROBE = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class ChatTokens:
    """Messages -> token ids with a tokenizer's chat template; turns' text back from ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    def _render(self, messages: Sequence[Message], generation_prompt: bool, tools: Any = None) -> str:
        out = self.tok.apply_chat_template(
            [dict(m) for m in messages], tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(out)

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message], tools: Any = None) -> list[int]:
        """The conversation before the first model turn, ending with the assistant's generation prompt
        (`tools`: function schemas the template describes to the model)."""
        return self._encode(self._render(messages, True, tools))

    def continuation_ids(self, messages: Sequence[Message]) -> list[int]:
        """The ids the chat template adds after a model turn that ended on the end-of-turn token: the
        observation `messages`, then the next generation prompt. Found by rendering a probe conversation
        with and without them; an error if the template rewrites the earlier turns."""
        end = str(self.tok.eos_token)
        before = self._render(_PROBE, False)
        after = self._render([*_PROBE, *messages], True)
        cut = before.rfind(end) + len(end)
        if cut < len(end) or not after.startswith(before[:cut]):
            raise ValueError(
                "the chat template renders earlier turns differently once an observation follows (or the "
                f"assistant turn does not end with {end!r}); multi-turn episodes need a template that only "
                "appends."
            )
        return self._encode(after[cut:])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))


@dataclass(frozen=True)
class Task:
    """One episode to run: a fresh environment, the row it resets from, the row's id."""

    env: Environment
    row: Mapping[str, Any]
    row_id: int


@dataclass
class _Open:
    """An episode being built (internal: the runner's own mutable state; it returns frozen Episodes)."""

    task: Task
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turns: int = 0
    finish: FinishReason | None = None
    error: str | None = None

    def add_model_turn(self, gen: Generation, version: int) -> None:
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
        meta = {**self.task.row, "turns": self.turns, "turn_rewards": list(self.turn_rewards)}
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
) -> list[Episode]:
    """Run every task's episode to its end, all open episodes batched into one engine call per turn.

    `params` sample each turn (`n` is taken as 1, `max_new_tokens` capped by what is left of `max_tokens`;
    request i of turn t gets seed `params.seed + 1000 * t + i` when a seed is set). `version`: the policy
    version stamped on tokens the engine returns without one."""
    open_ = [_Open(t, chat.prompt_ids(reset_checked(t), getattr(t.env, "tools", None))) for t in tasks]
    for turn in range(max_turns):
        active = [s for s in open_ if s.finish is None]
        if not active:
            break
        requests = [_request(s, params, max_tokens, turn, i) for i, s in enumerate(active)]
        last = turn == max_turns - 1  # no observation after the last turn: nobody would answer it
        for s, gens in zip(active, generate(requests), strict=True):
            _advance(s, gens[0], chat, max_tokens if not last else 0, version)
    return [s.episode(chat.decode) for s in open_]


class EnvResetError(AscentError):
    """An environment refused a row at reset (most often a missing or malformed column)."""


def reset_checked(t: Task) -> list[Message]:
    """`t.env.reset(t.row)`, its failure an error that names the row and its fields."""
    try:
        return t.env.reset(t.row)
    except Exception as e:
        raise EnvResetError(
            f"row {t.row_id}: {type(t.env).__name__}.reset failed ({type(e).__name__}: {e}); the row has "
            f"fields {sorted(t.row)}. Fix the row or the environment."
        ) from e


def _request(s: _Open, params: SamplingParams, max_tokens: int, turn: int, i: int) -> GenerationRequest:
    left = max(1, max_tokens - len(s.ids))
    seed = None if params.seed is None else params.seed + 1000 * turn + i
    turn_params = replace(params, n=1, max_new_tokens=min(params.max_new_tokens, left), seed=seed)
    return GenerationRequest(
        s.prompt_ids + s.ids, turn_params, request_id=i, session_id=f"row{s.task.row_id}"
    )


def _advance(s: _Open, gen: Generation, chat: ChatTokens, max_tokens: int, version: int) -> None:
    """Append one model turn; let the environment answer it; close the episode when it ends."""
    s.add_model_turn(gen, version)
    if gen.finish_reason != "stop":  # cut by the token budget: the turn is unfinished, so is the episode
        s.finish = gen.finish_reason
        return
    try:
        result = s.task.env.step(chat.decode(gen.token_ids))
        observation = [] if result.done else chat.continuation_ids(result.observation)
    except Exception as e:  # user code: it costs this episode, never the batch
        s.finish, s.error = "abort", f"{type(e).__name__}: {e}"
        log.warning("environment failed on row %d turn %d: %s", s.task.row_id, s.turns, s.error)
        return
    s.turn_rewards.append(float(result.reward))
    if result.done:
        s.finish = "stop"
    elif len(s.ids) + len(observation) >= max_tokens:  # out of tokens (or of turns: max_tokens=0)
        s.finish = "length"
    else:
        s.add_observation(observation)
