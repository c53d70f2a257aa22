"""validate_rows: every kind of malformed row is reported with its row number and field, all at once."""

from __future__ import annotations

import pytest

from ascent.data import DataError, validate_rows

SRC = "data.train_path=x.jsonl"


def problems_of(rows, **kw) -> list[str]:
    with pytest.raises(DataError) as info:
        validate_rows(rows, SRC, **kw)
    assert str(info.value).startswith(SRC)
    return info.value.problems


def test_good_rows_pass():
    validate_rows([{"prompt": "a", "answer": 1, "reward_fn": "exact_match", "data_source": "t"}], SRC)
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "q"}]
    validate_rows(
        [{"prompt": messages}, {"prompt": messages, "prompt_ids": [1, 2]}], SRC, tokenizer_vocab_size=10
    )


def test_missing_and_empty_prompt():
    problems = problems_of([{"prompt": "ok"}, {"answer": 1}, {"prompt": "  "}, {"prompt": []}])
    assert problems == [
        "row 2: field 'prompt' is missing; every row needs a non-empty prompt.",
        "row 3: field 'prompt' is empty; every row needs a non-empty prompt.",
        "row 4: field 'prompt' is an empty message list; add at least one message.",
    ]


def test_wrong_types():
    problems = problems_of(
        [{"prompt": 5}, {"prompt": "a", "reward_fn": 3}, {"prompt": "a", "data_source": ["x"]}, 7]
    )
    assert "row 1: field 'prompt' has type int" in problems[0]
    assert problems[1] == "row 2: field 'reward_fn' has type int; it must be a string."
    assert "row 3: field 'data_source' has type list" in problems[2]
    assert problems[3] == "row 4: expected an object (dict), got int."


def test_bad_messages():
    rows = [{"prompt": [{"role": "robot", "content": "x"}, {"role": "user"}, "hello"]}]
    problems = problems_of(rows)
    assert (
        problems[0]
        == "row 1: field 'prompt' message 0 has role 'robot'; use one of system, user, assistant, tool."
    )
    assert "message 1: 'content' is missing" in problems[1]
    assert "message 2 has type str" in problems[2]


def test_mixed_single_and_multi_turn():
    rows = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": [{"role": "user", "content": "c"}]}]
    (problem,) = problems_of(rows)
    assert "mixes single-turn strings (2 rows, first row 1)" in problem
    assert "message lists (1 rows, first row 3)" in problem


def test_prompt_ids_checked_against_vocab():
    rows = [
        {"prompt": "a", "prompt_ids": [1, 2, 99]},
        {"prompt": "b", "prompt_ids": [1, "2"]},
        {"prompt": "c", "prompt_ids": []},
    ]
    problems = problems_of(rows, tokenizer_vocab_size=50)
    assert "row 1: field 'prompt_ids' holds 1 id(s) outside the vocabulary [0, 50) (first: 99)" in problems[0]
    assert "row 2: field 'prompt_ids' holds non-integers (first: '2')" in problems[1]
    assert "row 3: field 'prompt_ids' must be a non-empty list" in problems[2]
    validate_rows(rows[:1], SRC)  # without a vocab size the range is not checked


def test_many_problems_are_capped_with_total_count():
    rows = [{"answer": i} for i in range(25)]
    with pytest.raises(DataError) as info:
        validate_rows(rows, SRC)
    message = str(info.value)
    assert message.splitlines()[0] == f"{SRC}: 25 problem(s) in 25 rows (first 10 shown):"
    assert "row 10: field 'prompt' is missing" in message and "row 11:" not in message
    assert message.splitlines()[-1] == "  ... and 15 more."
    assert len(info.value.problems) == 25


def test_empty_dataset():
    with pytest.raises(DataError, match="has no rows"):
        validate_rows([], SRC)


def test_single_problem_is_one_line():
    with pytest.raises(DataError) as info:
        validate_rows([{"prompt": "a"}, {"prompt": ""}], SRC)
    assert str(info.value) == f"{SRC} row 2: field 'prompt' is empty; every row needs a non-empty prompt."
