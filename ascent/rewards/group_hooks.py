"""Group hooks: reward shaping and filters that see a whole group (`reward.group_hooks`).

A hook is a pure function of one group (the episodes of one task, scored) and its own settings:

    shaping:  hook(group: Group, **settings) -> Group   # the same episodes, rewards adjusted
    filter:   hook(group: Group, **settings) -> bool    # False drops the group

The collector runs the configured hooks in order on every scored batch (each sees the rewards the hooks
before it left). It records what a shaping hook added to each episode's reward as a reward component named
after the hook (`Episode.reward_components`), and logs its mean as `reward/<name>/mean`; a filter's dropped
groups are counted in `reward/<name>/dropped_groups` and replaced by fresh prompts, as DAPO's dynamic
sampling does. `add_to_rewards` is the helper a shaping hook returns with.

Built-ins (`GROUP_HOOKS`):
- `curiosity`: Pixel-Reasoner's curiosity bonus and call penalty (Wang et al. 2025, "Pixel Reasoner:
  Incentivizing Pixel-Space Reasoning with Curiosity-Driven Reinforcement Learning"). The paper shapes
  r + alpha * max(H - RaPR, 0) * 1[the response used the tool] + beta * min(n_max - n_calls, 0), where RaPR
  is the share of the query's rollouts that used the tool. Its settings, as we recall them from the paper
  (check it before citing them): H = 0.3, alpha = 0.5, beta = 0.05, n_max = 1; they are the defaults here.
- `length_penalty`: Kimi k1.5's group-relative length reward (Kimi Team 2025, "Kimi k1.5: Scaling
  Reinforcement Learning with LLMs"): lambda = 0.5 - (len - min_len) / (max_len - min_len) over the group's
  response lengths, added as is to correct responses and as min(0, lambda) to the others, times `coef`.
  DAPO's overlong penalty (`algorithm.overlong_buffer`) is the per-episode one.
- `difficulty_filter`: keeps the groups whose mean reward lies in [low, high] (e.g. low 0.1, high 0.9 drops
  the tasks every sample solves and those none does).

Tool use comes from `ascent.messages.tool_calls` (an episode's `metadata["tool_calls"]`). Imports only
`ascent.messages`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ascent.messages import Group, tool_calls

GroupHook = Callable[..., Group | bool]


def add_to_rewards(group: Group, deltas: Sequence[float]) -> Group:
    """`group` with `deltas[i]` added to episode i's reward (the collector records them as the hook's reward
    component)."""
    if len(deltas) != len(group.episodes):
        raise ValueError(
            f"add_to_rewards: {len(deltas)} deltas for a group of {len(group.episodes)} episodes"
        )
    episodes = tuple(replace(e, reward=e.reward + d) for e, d in zip(group.episodes, deltas, strict=True))
    return replace(group, episodes=episodes)


def tool_rate(group: Group) -> float:
    """The share of the group's episodes that made at least one tool call."""
    return sum(tool_calls(e) > 0 for e in group.episodes) / len(group.episodes)


def curiosity(
    group: Group, *, target_rate: float = 0.3, alpha: float = 0.5, beta: float = 0.05, max_calls: int = 1
) -> Group:
    """Pixel-Reasoner's shaping: an episode that called a tool gets alpha * max(target_rate - rate, 0), rate
    being the group's `tool_rate`; every episode loses beta per call beyond `max_calls`."""
    bonus = alpha * max(target_rate - tool_rate(group), 0.0)
    calls = [tool_calls(e) for e in group.episodes]
    return add_to_rewards(group, [(bonus if n > 0 else 0.0) - beta * max(n - max_calls, 0) for n in calls])


def length_penalty(group: Group, *, coef: float = 1.0, correct_at: float = 1.0) -> Group:
    """Kimi k1.5's length reward over response lengths (tokens of `response_ids`): lambda = 0.5 - (len -
    min) / (max - min), coef * lambda for an episode whose reward is >= `correct_at`, coef * min(0, lambda)
    for the others; 0 for all when every length is the same."""
    lengths = [len(e.response_ids) for e in group.episodes]
    low, high = min(lengths), max(lengths)
    if high == low:
        return add_to_rewards(group, [0.0] * len(lengths))
    lams = [0.5 - (n - low) / (high - low) for n in lengths]
    correct = [e.reward >= correct_at for e in group.episodes]
    return add_to_rewards(
        group, [coef * (lam if ok else min(0.0, lam)) for lam, ok in zip(lams, correct, strict=True)]
    )


def difficulty_filter(group: Group, *, low: float, high: float) -> bool:
    """Keep the group when its mean reward lies in [low, high]."""
    mean = sum(e.reward for e in group.episodes) / len(group.episodes)
    return low <= mean <= high


GROUP_HOOKS: dict[str, GroupHook] = {
    "curiosity": curiosity,
    "length_penalty": length_penalty,
    "difficulty_filter": difficulty_filter,
}
