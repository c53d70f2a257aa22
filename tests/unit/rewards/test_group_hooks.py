"""The built-in group hooks on hand-made groups, each value computed by hand: Pixel-Reasoner's curiosity bonus
and call penalty, Kimi k1.5's group-relative length reward, the difficulty filter."""

from __future__ import annotations

import pytest

from ascent.messages import Episode, Group, tool_calls
from ascent.rewards.group_hooks import (
    add_to_rewards,
    curiosity,
    difficulty_filter,
    length_penalty,
    tool_rate,
)


def episode(reward: float = 0.0, calls: int | None = None, length: int = 1) -> Episode:
    meta = {} if calls is None else {"tool_calls": calls}
    return Episode([1], [2] * length, [0.0] * length, [1] * length, "stop", 0, reward=reward, metadata=meta)


def group(*episodes: Episode) -> Group:
    return Group(tuple(episodes))


def rewards(g: Group) -> list[float]:
    return [e.reward for e in g.episodes]


def test_tool_calls_default_to_zero_and_the_rate_counts_episodes_that_called() -> None:
    g = group(episode(calls=0), episode(calls=3), episode(), episode(calls=1))
    assert [tool_calls(e) for e in g.episodes] == [0, 3, 0, 1]
    assert tool_rate(g) == 0.5


def test_curiosity_pays_callers_while_the_group_rate_is_under_the_target() -> None:
    # rate 1/4 < 0.3: the caller gets 0.5 * (0.3 - 0.25) = 0.025; one call is within max_calls=1
    g = group(episode(1.0, calls=1), episode(0.0), episode(1.0), episode(0.0))
    assert rewards(curiosity(g)) == pytest.approx([1.025, 0.0, 1.0, 0.0])
    # the paper's defaults
    assert (curiosity.__kwdefaults__ or {}) == {
        "target_rate": 0.3,
        "alpha": 0.5,
        "beta": 0.05,
        "max_calls": 1,
    }


def test_curiosity_penalises_calls_beyond_the_limit_and_stops_paying_above_the_target() -> None:
    # rate 2/4 = 0.5: with target 0.75 and alpha 1 each caller gets 0.25; 3 calls, 2 over max_calls=1: -0.2
    g = group(episode(0.0, calls=0), episode(1.0, calls=1), episode(1.0, calls=3), episode(0.0))
    shaped = curiosity(g, target_rate=0.75, alpha=1.0, beta=0.1, max_calls=1)
    assert rewards(shaped) == pytest.approx([0.0, 1.25, 1.05, 0.0])
    # at the default target 0.3 the rate 0.5 earns no bonus; the penalty stays: 2 over the limit * 0.05
    assert rewards(curiosity(g)) == pytest.approx([0.0, 1.0, 0.9, 0.0])


def test_length_penalty_is_kimis_group_relative_length_reward() -> None:
    # lengths 2, 4, 6, 10: lambda = 0.5 - (len - 2) / 8 = 0.5, 0.25, 0, -0.5
    # correct (reward >= 1) keep lambda, the others get min(0, lambda): 0.5, 0, 0, -0.5; times coef 2
    g = group(episode(1.0, length=2), episode(0.0, length=4), episode(1.0, length=6), episode(0.0, length=10))
    assert rewards(length_penalty(g, coef=2.0)) == pytest.approx([2.0, 0.0, 1.0, -1.0])
    # a lower bar for "correct": the 0-reward episode of length 4 now keeps its +0.25
    assert rewards(length_penalty(g, correct_at=0.0)) == pytest.approx([1.5, 0.25, 1.0, -0.5])


def test_length_penalty_is_zero_when_every_length_is_the_same() -> None:
    g = group(episode(1.0, length=3), episode(0.0, length=3))
    assert rewards(length_penalty(g)) == [1.0, 0.0]


def test_difficulty_filter_keeps_groups_whose_mean_is_within_the_bounds_inclusive() -> None:
    half = group(episode(1.0), episode(0.0))
    solved = group(episode(1.0), episode(1.0))
    unsolved = group(episode(0.0), episode(0.0))
    assert difficulty_filter(half, low=0.1, high=0.9)
    assert not difficulty_filter(solved, low=0.1, high=0.9) and not difficulty_filter(
        unsolved, low=0.1, high=0.9
    )
    assert difficulty_filter(solved, low=0.0, high=1.0)  # the bounds count as inside


def test_add_to_rewards_returns_a_new_group_and_checks_the_count() -> None:
    g = group(episode(1.0), episode(0.0))
    assert rewards(add_to_rewards(g, [0.5, -0.5])) == [1.5, -0.5] and rewards(g) == [1.0, 0.0]
    with pytest.raises(ValueError, match="1 deltas for a group of 2"):
        add_to_rewards(g, [0.5])
