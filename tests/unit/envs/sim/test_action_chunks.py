"""An action head's turns in a simulator (ascent.envs.sim): a chunk of continuous vectors runs its steps in
order, clipped to the Box's bounds, the turn's reward their sum; an episode that ends mid-chunk drops the
rest; a chunk that does not fit the space ends the episode like an unparseable turn. ReachContinuous's
reward is the distance closed, plus 1 on reaching the target."""

from __future__ import annotations

import numpy as np
import pytest

from ascent.envs.sim import GymEnv, SimVectorEnvs
from ascent.envs.sim.actions import ActionTokenizer, parse_chunk
from ascent.envs.sim.reach import CONTINUOUS_ID


def row(seed: int) -> dict:
    return {"gym_id": CONTINUOUS_ID, "seed": seed, "success_rule": "goal"}


def offset(messages) -> float:
    return float(messages[0]["content"].split()[-1])


def test_a_chunk_is_clipped_to_the_box_and_must_fit_its_dimensions() -> None:
    box = ActionTokenizer(low=(-1.0, 0.0), high=(1.0, 2.0), bins=8)
    steps = parse_chunk(box, [[3.0, -1.0], [0.5, 1.0]])
    assert steps is not None and np.allclose(np.stack(steps), [[1.0, 0.0], [0.5, 1.0]])
    assert parse_chunk(box, [[0.0]]) is None and parse_chunk(box, []) is None
    assert parse_chunk(ActionTokenizer(low=(0.0,), high=(1.0,), bins=2, discrete=True), [[1.0]]) is None
    assert parse_chunk(box, "<a1><a2>") is not None  # action words: one step


def test_a_chunk_steps_in_order_and_an_episode_ending_mid_chunk_drops_the_rest() -> None:
    vec = SimVectorEnvs()
    starts = [offset(out[0]) for out in vec.reset([row(1), row(2)])]
    assert sorted(starts) == [-1.0, 1.0]
    away = [[-starts[0] * 0.5], [-starts[0] * 0.25]]  # two steps away from the target
    toward = [[starts[1]], [-starts[1]]]  # reaches it at once: the second step is dropped
    a, b = vec.step([(0, away), (1, toward)])
    assert not isinstance(a, str) and not isinstance(b, str)
    assert a.info["step_rewards"] == pytest.approx([-0.5, -0.25]) and a.reward == pytest.approx(-0.75)
    assert a.info["episode_length"] == 2 and not a.done
    assert b.done and b.info["success"] and b.info["episode_length"] == 1 and b.reward == pytest.approx(2.0)
    bad = vec.step([(0, [[0.1, 0.2]])])[0]  # two dimensions for a one-dimensional Box
    assert not isinstance(bad, str) and bad.done and bad.info["invalid_action"]


def test_the_single_environment_runs_chunks_the_same_way() -> None:
    env = GymEnv()
    start = offset(env.reset(row(1)))
    result = env.step([[start * 0.5], [start * 0.5]])  # two half steps toward the target
    assert result.done and result.info["success"] and result.info["step_rewards"] == pytest.approx([0.5, 1.5])
    env.close()
