"""The math_verify reward: symbolic equivalence, boxed answers, and working off the main thread."""

from __future__ import annotations

import threading

import pytest

from ascent.rewards import math_verify_reward, resolve_reward_fn


def score(response: str, answer) -> float:
    return math_verify_reward("prompt", response, [], {"answer": answer})


def test_boxed_fraction_matches_decimal():
    assert score("Half of it: \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert score("so it is 0.5", "\\frac{1}{2}") == 1.0
    assert score("\\boxed{\\frac{1}{3}}", "0.5") == 0.0


def test_expressions_and_bare_latex_gold():
    assert score("The result is $\\boxed{(x+1)^2}$", "x^2+2x+1") == 1.0
    assert score("\\boxed{x^2}", "x^2+2x+1") == 0.0
    assert score("I cannot solve this.", "3") == 0.0


def test_unparseable_gold_raises():
    with pytest.raises(ValueError, match="cannot parse the reference answer ''"):
        score("\\boxed{1}", "  ")


def test_non_math_gold_falls_back_to_string_comparison():
    assert score("\\boxed{B}", "B") == 1.0
    assert score("\\boxed{C}", "B") == 0.0


def test_registered_and_works_in_a_thread():
    fn = resolve_reward_fn("math_verify")
    results: list[float] = []
    worker = threading.Thread(
        target=lambda: results.append(fn("p", "\\boxed{\\frac{1}{2}}", [], {"answer": 0.5}))
    )
    worker.start()
    worker.join()
    assert results == [1.0]
