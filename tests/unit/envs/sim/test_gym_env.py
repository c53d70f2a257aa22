"""GymEnv: seeded resets, state text, success and episode length, bad actions, the loop's metrics."""

from __future__ import annotations

import pytest

from ascent.envs import make_env
from ascent.envs.runner import checked_step
from ascent.envs.tasks.control_task import control_rows
from ascent.messages import Episode, Group
from ascent.orchestrator.episodes import env_metrics

CARTPOLE = {"gym_id": "CartPole-v1", "seed": 7, "max_steps": 5, "env": "gym"}


def play(row, actions):
    env = make_env("gym")
    first, results = env.reset(row), []
    for a in actions:
        results.append(env.step(a))
        if results[-1].done:
            break
    return first, results


def test_the_same_seed_starts_and_plays_the_same_and_another_seed_differs():
    a = play(CARTPOLE, ["<a0>", "<a1>", "<a1>"])
    b = play(CARTPOLE, ["<a0>", "<a1>", "<a1>"])
    c = play({**CARTPOLE, "seed": 8}, ["<a0>"])
    assert a == b
    assert a[0][0]["content"] != c[0][0]["content"]
    assert len(a[0][0]["content"].split("State: ")[1].split()) == 4  # CartPole's 4 numbers


def test_without_instructions_the_first_message_is_the_state_alone():
    row = control_rows("reach", [3])[0]
    told, _ = play(row, [])
    (bare,), results = play({**row, "instructions": False}, ["<a1>"])
    assert told[0]["content"].endswith(f"State: {bare['content']}") and "<a0>" not in bare["content"]
    assert bare["content"].lstrip("-") in {"1", "2"}  # Reach's offset, decimals 0
    assert results[0].done or results[0].observation[0]["content"].lstrip("-") in {"1", "2", "3"}


def test_surviving_the_step_limit_is_a_success_with_its_length():
    _, results = play(CARTPOLE, ["<a0>", "<a1>"] * 3)
    last = next(r for r in results if r.done)
    assert [checked_step(r) for r in results[:5]] == [1.0] * 5
    assert last.info["success"] and last.info["truncated"] and last.info["episode_length"] == 5


def test_falling_is_no_success():
    row = {**CARTPOLE, "max_steps": 200}
    _, results = play(row, ["<a1>"] * 60)  # always right: the pole falls within a few dozen steps
    last = next(r for r in results if r.done)
    assert last.info["terminated"] and not last.info["success"] and last.info["episode_length"] < 60


def test_an_unparseable_action_ends_the_episode_without_reward():
    _, (good, bad) = play(CARTPOLE, ["<a1>", "I push left"])
    assert not good.done and bad.done and bad.reward == 0.0
    assert bad.info["invalid_action"] and not bad.info["success"] and bad.info["episode_length"] == 1


def test_a_return_threshold_decides_success():
    row = {"gym_id": "Pendulum-v1", "seed": 0, "max_steps": 2, "bins": 8, "success_return": -1e9}
    _, results = play(row, ["<a4>", "<a4>"])
    assert results[-1].done and results[-1].info["success"]


def test_a_row_without_gym_id_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="gym_id"):
        make_env("gym").reset({"seed": 1})


def test_control_rows_carry_distinct_seeds_and_the_env():
    rows = control_rows("pendulum", [3, 4])
    assert [r["seed"] for r in rows] == [3, 4] and {r["env"] for r in rows} == {"gym"}
    with pytest.raises(ValueError, match="cartpole"):
        control_rows("walker", [1])


def _episode(reward, **meta):
    return Episode([1], [2], [0.0], [1], "stop", 0, reward=reward, metadata=meta)


def test_env_metrics_report_success_rate_and_length_only_for_simulators():
    sims = [_episode(5.0, success=True, episode_length=5), _episode(2.0, success=False, episode_length=2)]
    cut = _episode(0.0, success_rule="survive")  # its first turn never reached the simulator: a failure
    metrics = env_metrics([Group((*sims, cut)), Group((_episode(0.0),))], max_failure_rate=0.0)
    assert metrics["env/success_rate"] == 1 / 3 and metrics["env/episode_length"] == 7 / 3
    plain = env_metrics([Group((_episode(1.0, turns=1),))], max_failure_rate=0.0)
    assert "env/success_rate" not in plain and "env/episode_length" not in plain


def test_image_observations_are_rgb_parts_beside_the_text():
    row = {"gym_id": "InvertedPendulum-v5", "seed": 0, "max_steps": 3, "bins": 8, "image_obs": True}
    env = make_env("gym")
    (first,) = env.reset(row)
    image, text = first["content"]
    assert image["type"] == "image" and image["image"].shape == (128, 128, 3)
    assert image["image"].dtype.name == "uint8" and text["type"] == "text" and "State:" in text["text"]
    step = env.step("<a4>")
    assert step.observation[0]["content"][0]["type"] == "image" and len(env.frames) == 2
