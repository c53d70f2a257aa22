"""The messages that move between workers and between the stages of the loop (design: "Episodes and the
collector"): requests and generations at the engine, episodes and groups in the loop, train samples at the
trainer. All are frozen dataclasses: a stage returns new messages instead of editing the ones it was given.

Everything here is plain Python (lists of ints and floats), so it pickles cheaply across Ray and imports
without torch or anything else of ascent. Tokens go in and come out as ids: nothing generated is ever
re-tokenized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """How the rollout engine samples. `temperature=0` means greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    n: int = 1  # samples per request
    seed: int | None = None
    grammar: str | None = None  # an llguidance grammar (JSON) the response follows; reference engine only
    max_time_s: float | None = None  # wall-clock budget from admission: past it the sample ends as "abort"
    # sample only these ids (a VLA's action tokens; empty: all), a turn of max_new_tokens of them complete
    # ("stop"); a filter: logprobs stay the unfiltered distribution's, as the trainer scores them;
    # reference engine only
    allowed_token_ids: tuple[int, ...] = ()
    # an environment's episodes: turn i samples under turn_grammars[min(i, len - 1)] (the episode runner
    # sets `grammar` per turn from it; engines read only `grammar`)
    turn_grammars: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageInput:
    """One image as a vision-language model sees it: the image processor's patches, their grid, and how many
    `<|image_pad|>` tokens stand for it in the token ids (design: "Episodes and the collector"; images
    travel beside the ids, in the order of their placeholder runs).

    `pixel_values` is a float array [patches, channels * temporal_patch * patch * patch] (a torch tensor or
    a numpy array; compared by `digest`, never element-wise); `grid_thw` is (frames, rows, columns) of
    patches; `num_tokens` = t * h * w / merge_size**2. `digest` identifies the image's pixels (a hash of
    what was encoded), so engines may encode an image once for every sample and turn that shows it;
    `source` says where it came from (a path, `row 3 part 1`, `turn 2: zoom_in`)."""

    pixel_values: Any = field(compare=False, repr=False)
    grid_thw: tuple[int, int, int]
    num_tokens: int
    digest: str
    source: str = ""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to sample `params.n` continuations of.

    `session_id` marks a multi-turn continuation: `prompt_ids` is then the whole conversation so far
    (previous prompt + response + tool tokens) and an engine that kept that session's cache may reuse it.
    """

    prompt_ids: list[int]
    params: SamplingParams
    request_id: int = 0
    session_id: str | None = None
    images: tuple[ImageInput, ...] = ()  # one per `<|image_pad|>` run of prompt_ids, in order


@dataclass(frozen=True)
class Generation:
    """One sampled continuation: token ids, the sampler's logprob of each, and why it ended.

    `token_versions` holds the policy version each token was sampled with (the rollout worker stamps a copy
    with the weights it held; an engine that swaps weights between decode steps fills it per token).
    `action` (an action-head policy): the continuous action chunk this turn chose, see the field.
    `cached_tokens` counts the prompt tokens whose keys and values the engine reused from a cached session
    instead of computing them (prefix reuse of a multi-turn `session_id`; 0 for engines that keep none).
    `routed_experts` (MoE models, engines that record routing): the experts the engine chose for every
    prompt and response token in each MoE layer, an int array [prompt + response tokens, moe layers, k]
    (a torch tensor; -1 where not recorded), replayed by the trainer (`ascent.models.moe`); None otherwise."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    token_versions: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    routed_experts: Any = field(default=None, compare=False, repr=False)
    # an action-head policy's action chunk [chunk][action_dim]: `token_ids` is then its one placeholder
    # token and `logprobs` the chunk's log-probability (`ascent.rollout.action_sampler`); None otherwise
    action: list[list[float]] | None = None
    # per token, True where a grammar allowed that token alone (the sampler had no choice); empty: none
    forced: list[bool] = field(default_factory=list)

    def loss_mask(self) -> list[int]:
        """1 per token the policy chose, 0 per token its grammar forced (`sampled_loss_mask`)."""
        return sampled_loss_mask(self.forced, len(self.token_ids))


def sampled_loss_mask(forced: Sequence[bool], num_tokens: int) -> list[int]:
    """The loss mask of `num_tokens` sampled tokens: 1 per token the policy chose, 0 per token its grammar
    forced (`forced[i]`; empty: none was). A forced token is no action, and its logprob under the
    unconstrained distribution (what the trainer scores) can be far below zero, so it would carry a large
    gradient for a choice nobody made. Used wherever sampled tokens become an episode (the env runner, the
    single-turn batch, the agent endpoint's records)."""
    if not forced:
        return [1] * num_tokens
    if len(forced) != num_tokens:
        raise ValueError(
            f"forced has {len(forced)} flags for {num_tokens} tokens: give one per token, or none"
        )
    return [0 if f else 1 for f in forced]


@dataclass(frozen=True)
class Rollout:
    """What one rollout replica returns for one `generate` call.

    `generations[i]` are the samples of request i; `policy_version` is the version of the weights the
    replica held for the call; `idle_s` is how long the replica had no generation work before the call
    (since its previous call ended; 0 for its first)."""

    generations: list[list[Generation]]
    policy_version: int
    idle_s: float


@dataclass(frozen=True)
class Episode:
    """One attempt at one task: the prompt, the sampled response (or the turns of a multi-turn episode),
    the sampler's logprobs and the reward; the unit the algorithms and the trainer consume.

    `response_ids`, `sampler_logprobs`, `loss_mask` and `token_versions` have one entry per response token.
    `loss_mask` is 1 for tokens the policy produced and 0 for tool or environment tokens spliced into a
    multi-turn response. A stage that changes an episode returns a new one (`dataclasses.replace`); the
    lists are never edited in place.

    `metadata` holds the row's fields and what the episode's source adds: a multi-turn episode's `turns`,
    and `tool_calls`, the number of tool calls the model made (`tool_calls(e)` reads it: 0 when absent).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    sampler_logprobs: list[float]
    loss_mask: list[int]
    finish_reason: FinishReason
    row_id: int
    policy_version: int = 0  # the oldest token's version (what staleness is measured from)
    token_versions: list[int] = field(default_factory=list)  # per response token (empty: all policy_version)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    response_text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    images: tuple[ImageInput, ...] = ()  # one per image-token run of prompt_ids + response_ids, in order
    # MoE: the sampler's experts per token of prompt_ids + response_ids (`Generation.routed_experts`)
    routed_experts: Any = field(default=None, compare=False, repr=False)
    # an action-head policy's action chunks, one per sampled (loss mask 1) token, in order: each such token
    # is an action's placeholder and its sampler logprob the chunk's log-probability; empty otherwise
    actions: list[list[list[float]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass(frozen=True)
class Group:
    """The episodes of one task, compared with each other by group-relative estimators (GRPO, RLOO, ...).

    A group's size is its number of episodes (never recomputed from `samples_per_prompt`: a multi-turn or
    partial group may differ); its identity within an iteration is its place in that iteration's list.
    `baseline_reward` is ReMax's: the reward of the greedy response to the same task."""

    episodes: tuple[Episode, ...]
    baseline_reward: float | None = None

    @property
    def row_id(self) -> int:
        return self.episodes[0].row_id


TOOL_CALLS = "tool_calls"  # the metadata key of an episode's tool-call count


def tool_calls(e: Episode) -> int:
    """How many tool calls the model made in `e` (`metadata["tool_calls"]`, set by the environment runner
    from its environment's `info["tool_calls"]` and by the agent path from the replies' parsed calls; 0 for
    single-turn episodes and sources that record none)."""
    return int(e.metadata.get(TOOL_CALLS, 0))


def flatten(groups: Sequence[Group]) -> list[Episode]:
    """The episodes of `groups`, group after group (the order every per-episode list of an iteration uses)."""
    return [e for g in groups for e in g.episodes]


def regroup(groups: Sequence[Group], episodes: Sequence[Episode]) -> list[Group]:
    """`groups` with their episodes replaced, in order, by `episodes` (one per episode of
    `flatten(groups)`)."""
    if len(episodes) != sum(len(g.episodes) for g in groups):
        raise ValueError(
            f"regroup: {len(episodes)} episodes for groups of {[len(g.episodes) for g in groups]}"
        )
    out, start = [], 0
    for g in groups:
        out.append(replace(g, episodes=tuple(episodes[start : start + len(g.episodes)])))
        start += len(g.episodes)
    return out


@dataclass(frozen=True)
class TrainSample:
    """An episode prepared for the update: token ids plus per-response-token training targets.

    Per-token lists (`old_logprobs`, `advantages`, `loss_mask`, `ref_logprobs`, `sampler_logprobs`, `returns`,
    `old_values`) align with `response_ids`. `old_logprobs` are the trainer's own (recomputed) logprobs
    under the policy that sampled the batch.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    advantages: list[float]
    old_logprobs: list[float] | None = None
    sampler_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    returns: list[float] | None = None
    old_values: list[float] | None = None
    images: tuple[ImageInput, ...] = ()  # the episode's images (`Episode.images`)
    routed_experts: Any = field(default=None, compare=False, repr=False)  # `Episode.routed_experts`, replayed
    actions: list[list[list[float]]] = field(default_factory=list)  # `Episode.actions`, scored by the head

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


USER_ERRORS = (Exception, SystemExit)  # what user code may raise at the cost of its call (not Ctrl-C)


@dataclass(frozen=True)
class Outcome:
    """What one call of user code (a reward, an environment's step, an agent's episode) gave: `value` when
    `error` is None, else `error` says why it failed ("ValueError: ...", "timed out after 30 s (...)")."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def of(cls, fn: Callable[..., Any], *args: Any) -> Outcome:
        """fn(*args) as an Outcome: an exception, `sys.exit` included, becomes its error (KeyboardInterrupt,
        the user's Ctrl-C, is not user code's failure and goes on up)."""
        try:
            return cls(value=fn(*args))
        except USER_ERRORS as err:
            return cls(error=f"{type(err).__name__}: {err}")
