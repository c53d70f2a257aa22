"""Built-in rewards on hand-written cases: exact_match, numeric_match, gsm8k, format."""

from __future__ import annotations

import pytest

from ascent.rewards import REWARD_FUNCTIONS, exact_match, format_reward, gsm8k, numeric_match
from ascent.rewards.builtin import find_numbers, gold_number


def call(fn, response: str, answer=None, **kwargs) -> float:
    metadata = {} if answer is None else {"answer": answer}
    return fn("prompt", response, [1, 2], metadata, **kwargs)


def test_registry_names():
    assert set(REWARD_FUNCTIONS) == {"exact_match", "numeric_match", "math_verify", "gsm8k", "format"}


def test_exact_match():
    assert call(exact_match, "  42\n", "42") == 1.0
    assert call(exact_match, "42", 42) == 1.0
    assert call(exact_match, "42.0", "42") == 0.0
    assert exact_match("p", "Paris", [], {"city": "Paris"}, answer_key="city", unused=1) == 1.0


def test_missing_answer_names_field():
    with pytest.raises(KeyError, match="exact_match needs the reference answer in dataset field 'answer'"):
        call(exact_match, "42")


def test_a_null_answer_says_it_is_null_not_missing():
    # before: "needs the reference answer in dataset field 'answer'; the row has fields ['answer']"
    with pytest.raises(
        KeyError, match="dataset field 'answer' is null on this row; give every row an answer"
    ):
        exact_match("p", "42", [], {"answer": None})


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("I have 1,234 apples and -5 pears", [1234.0, -5.0]),
        ("x = +3.25, then .5", [3.25, 0.5]),
        ("3-5 is not negative five", [3.0, 5.0]),
        ("about 3/4 of 12", [0.75, 12.0]),
        ("list: 1, 2, 3", [1.0, 2.0, 3.0]),
        ("no digits here", []),
    ],
)
def test_find_numbers(text, numbers):
    assert find_numbers(text) == pytest.approx(numbers)


def test_numeric_match():
    assert call(numeric_match, "so the total is 1,234.", "1234") == 1.0
    assert call(numeric_match, "first 7 then -12", -12) == 1.0
    assert call(numeric_match, "the answer is 3/4", "0.75") == 1.0
    assert call(numeric_match, "the answer is 0.75", "3/4") == 1.0
    assert call(numeric_match, "the answer is 3/4", "0.75", fractions=False) == 0.0  # last number is 4
    assert call(numeric_match, "12 then 13", 12) == 0.0  # the last number counts
    assert call(numeric_match, "0.3333333", "1/3") == 1.0
    assert call(numeric_match, "0.33", "1/3") == 0.0
    assert call(numeric_match, "0.33", "1/3", abs_tol=0.01) == 1.0
    assert call(numeric_match, "no number", 5) == 0.0


def test_gold_number_forms():
    assert gold_number(7) == 7.0
    assert gold_number("Natalia sold 48/2 = 24 clips.\n#### 72") == 72.0
    assert gold_number(" -1,000 ") == -1000.0
    with pytest.raises(ValueError, match="holds no number"):
        gold_number("seven")


def test_gsm8k():
    solution = "She sold 48 + 24 = 72 clips.\n#### 72"
    assert call(gsm8k, "48 + 24 = 72\n#### 72", solution) == 1.0
    assert call(gsm8k, "#### $1,234.", "1234") == 1.0
    assert call(gsm8k, "#### 5\nwait, no\n#### 72", 72) == 1.0  # the last marker counts
    assert call(gsm8k, "the answer is 72", solution) == 0.0  # no marker
    assert call(gsm8k, "#### 71", solution) == 0.0
    assert call(gsm8k, "#### 71", solution, format_score=0.1) == 0.1
    assert call(gsm8k, "#### none", solution, format_score=0.1) == 0.0


def test_format_reward():
    assert call(format_reward, "work...\n#### 42") == 1.0
    assert call(format_reward, "so \\boxed{\\frac{1}{2}}") == 1.0
    assert call(format_reward, "the answer is 42") == 0.0
    assert call(format_reward, "<think>x</think> 4", pattern=r"<think>.*</think>") == 1.0
    assert call(format_reward, "a <think>x</think>", pattern=r"<think>.*</think>", fullmatch=True) == 0.0
    with pytest.raises(ValueError, match="reward.kwargs.pattern='\\(' is not a valid regex"):
        call(format_reward, "x", pattern="(")
