"""Replay: each iteration trains on `replay.ratio` of its groups drawn from an experience store
(`ascent.tracking.experience_store`), the rest sampled fresh by the collector.

`load_replay` reads the store once at setup: its trained groups (whole: `rollout.samples_per_prompt`
episodes of one iteration's group, none of them itself a replay), each episode as the loop had it
(`EpisodeRecord.to_episode`: tokens, loss mask, sampler logprobs, token versions, shaped reward, and the
images of a vision-language episode, patches and all: `ascent.tracking.experience_images`) and marked
`metadata["replayed_from"] = {store, episode, iteration}`, which the experience store keeps, so a replayed
episode is told apart from a fresh one there. The score plug-in (`replay.score`, `score(group) -> float`;
`SCORES` has the built-ins) weighs each group once; `Replay.draw` picks an iteration's groups without
replacement with probability proportional to the weight (groups weighted 0 never), from a generator seeded
by (seed, iteration): a resumed run draws the same groups, and there is no state to checkpoint.

Replayed episodes are off-policy. They keep the versions of the run that sampled them, which do not compare
with this run's (another run counts its own publications), so the loop leaves them out of
`rollout/staleness_*` and the staleness bound, and the config requires importance correction against their
stored sampler logprobs (`algorithm.rollout_correction` tis or mis: `ascent.config.replay.replay_rules`).
The collector samples `prompts_per_step - groups` fresh groups (`specs.collect_spec`); `mix` appends the
drawn ones and reports `replay/groups` and `replay/mean_reward`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from ascent.config.replay import replay_groups
from ascent.config.schema import RunConfig
from ascent.errors import AscentError
from ascent.messages import Episode, Group, ImageInput, flatten
from ascent.plugins import resolve
from ascent.tracking.experience_store import EpisodeRecord, open_store, store_path

REPLAYED_FROM = "replayed_from"  # the metadata key that marks a replayed episode


def uniform(group: Group) -> float:
    """Every group alike."""
    return 1.0


def reward_variance(group: Group) -> float:
    """The variance of the group's rewards: groups with reward signal; those with equal rewards never."""
    rewards = [e.reward for e in group.episodes]
    mean = sum(rewards) / len(rewards)
    return sum((r - mean) ** 2 for r in rewards) / len(rewards)


def recent(group: Group) -> float:
    """1 + the newest policy version among the group's episodes (their oldest tokens'): newer weighs more."""
    return 1.0 + max(e.policy_version for e in group.episodes)


SCORES: Mapping[str, Callable[[Group], float]] = {
    "uniform": uniform,
    "reward_variance": reward_variance,
    "recent": recent,
}


class ReplayError(AscentError):
    """A replay store without usable groups, or a score that does not give usable weights."""


@dataclass(frozen=True)
class ReplaySpec:
    """What replay reads of the config: the store, groups per iteration, the score, the group size, seed."""

    store: str
    groups: int
    score: str
    samples_per_prompt: int
    seed: int

    @classmethod
    def of(cls, cfg: RunConfig) -> ReplaySpec | None:
        r = cfg.replay
        if r.store is None:
            return None
        return cls(r.store, replay_groups(cfg), r.score, cfg.rollout.samples_per_prompt, cfg.seed)


class Replay:
    """The stored groups and their weights; `draw(it)` gives iteration `it`'s `per_iteration` groups."""

    def __init__(self, groups: list[Group], weights: list[float], per_iteration: int, seed: int) -> None:
        drawable = sum(w > 0 for w in weights)
        if drawable < per_iteration:
            raise ReplayError(
                f"replay: {drawable} stored groups have a weight above 0, fewer than the {per_iteration} each "
                "iteration draws; lower replay.ratio, choose another replay.score, or replay a bigger store."
            )
        self.groups, self.per_iteration, self.seed = groups, per_iteration, seed
        total = sum(weights)
        self.p = np.array([w / total for w in weights])

    def draw(self, it: int) -> list[Group]:
        """Iteration `it`'s groups: distinct, each with probability proportional to its weight."""
        rng = np.random.default_rng([self.seed, it])
        picked = rng.choice(len(self.groups), size=self.per_iteration, replace=False, p=self.p)
        return [self.groups[int(i)] for i in picked]


def load_replay(spec: ReplaySpec) -> Replay:
    """The store's whole trained groups, weighed by the score (see the module docstring)."""
    score = resolve(SCORES, spec.score, "replay.score")
    path = store_path(spec.store)
    with open_store(path) as store:
        records = store.episodes(status="trained")
        images = {r.id: store.images(r.id) for r in records}
    groups = stored_groups(records, str(path), spec.samples_per_prompt, images)
    if not groups:
        raise ReplayError(
            f"replay.store={spec.store!r}: {path} holds no whole trained group of rollout.samples_per_prompt="
            f"{spec.samples_per_prompt} episodes ({len(records)} trained episodes); replay a run with the same "
            "samples_per_prompt."
        )
    return Replay(groups, [_weight(score, g, spec.score) for g in groups], spec.groups, spec.seed)


def stored_groups(
    records: list[EpisodeRecord],
    store: str,
    size: int,
    images: Mapping[int, tuple[ImageInput, ...]] | None = None,
) -> list[Group]:
    """The records as groups (by iteration and group index, in recording order): those of exactly `size`
    episodes, none of them a replay, each episode marked with where it came from and carrying its stored
    images (`images`: by episode id; a vision-language episode replays with the pixels it was sampled on)."""
    by_group: dict[tuple[int, int | None], list[Episode]] = {}
    replays: set[tuple[int, int | None]] = set()
    for r in records:
        key = (r.iteration, r.group_index)
        if REPLAYED_FROM in r.metadata:
            replays.add(key)
        mark = {"store": store, "episode": r.id, "iteration": r.iteration}
        ep = r.to_episode((images or {}).get(r.id, ()))
        by_group.setdefault(key, []).append(replace(ep, metadata={**ep.metadata, REPLAYED_FROM: mark}))
    return [
        Group(tuple(eps))
        for key, eps in by_group.items()
        if key[1] is not None and key not in replays and len(eps) == size
    ]


def _weight(score: Callable[[Group], float], group: Group, name: str) -> float:
    """`score(group)` checked: a finite number >= 0."""
    try:
        value = float(score(group))
    except Exception as err:  # a user's score: the error names it (setup, exit 2)
        raise ReplayError(
            f"replay.score={name!r} raised {type(err).__name__}: {err}; fix the score."
        ) from err
    if not math.isfinite(value) or value < 0:
        raise ReplayError(
            f"replay.score={name!r} gave {value} for a group of row {group.row_id}; a score is a finite "
            "number >= 0 (0: never drawn)."
        )
    return value


def mix(replay: Replay | None, fresh: list[Group], it: int) -> tuple[list[Group], dict[str, float]]:
    """The fresh groups, then iteration `it`'s replayed ones, and the replay metrics (none without replay)."""
    if replay is None:
        return fresh, {}
    replayed = replay.draw(it)
    rewards = [e.reward for e in flatten(replayed)]
    return fresh + replayed, {
        "replay/groups": float(len(replayed)),
        "replay/mean_reward": sum(rewards) / len(rewards),
    }
