"""The action tokenizer: continuous actions in bins and back, discrete by index, bad turns refused."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete

from ascent.envs.sim.actions import ActionTokenizer


def test_round_trip_moves_an_action_by_at_most_half_a_bin():
    space = Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32), dtype=np.float32)
    tok = ActionTokenizer.for_space(space, bins=256)
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = rng.uniform(space.low, space.high)
        back = tok.parse(tok.encode(a))
        half_bin = (space.high - space.low) / 256 / 2
        assert back.shape == (2,) and np.all(np.abs(back - a) <= half_bin + 1e-6)


def test_bounds_map_to_the_outer_bins_and_centres_stay_inside():
    tok = ActionTokenizer.for_space(Box(-1.0, 1.0, (1,), dtype=np.float32), bins=4)
    assert tok.encode([-1.0]) == "<a0>" and tok.encode([1.0]) == "<a3>" and tok.encode([7.0]) == "<a3>"
    assert tok.parse("<a0>")[0] == pytest.approx(-0.75) and tok.parse("<a3>")[0] == pytest.approx(0.75)
    assert tok.words == ["<a0>", "<a1>", "<a2>", "<a3>"]


def test_discrete_actions_are_indices():
    tok = ActionTokenizer.for_space(Discrete(3))
    assert tok.words == ["<a0>", "<a1>", "<a2>"] and tok.size == 1
    assert tok.parse("push <a2> now") == 2 and tok.encode(1) == "<a1>"


@pytest.mark.parametrize("text", ["", "left", "<a3>", "<a-1>", "<a 1>", "<a1"])
def test_unparseable_turns_give_none(text):
    tok = ActionTokenizer.for_space(Discrete(3))
    assert tok.parse(text) is None


def test_a_box_action_needs_a_word_per_dimension():
    tok = ActionTokenizer.for_space(Box(-1.0, 1.0, (2,), dtype=np.float32), bins=8)
    assert tok.parse("<a1>") is None and tok.parse("<a1><a9>") is None
    assert tok.parse("<a1> then <a7> <a0>") is not None  # the first two count


def test_infinite_bounds_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="infinite bound.*ClipAction"):
        ActionTokenizer.for_space(Box(-np.inf, np.inf, (1,), dtype=np.float32))
