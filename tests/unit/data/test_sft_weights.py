"""SFT loss masks chosen by the data and the config: an assistant message's `weight` (0 leaves the turn out
of the loss, OpenAI fine-tuning's per-message weight) and `turn_end_loss` (the EOS closing each turn in or
out); the ids never change, only the mask. Bad weights are refused with the row, the field, the value and
the fix."""

from __future__ import annotations

from typing import Any

import pytest

from ascent.data import render_sft_examples
from ascent.data.validation import DataError
from ascent.envs import ChatTokens

GAME = [
    {"role": "user", "content": "Guess my number from 0 to 9."},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "higher"},
    {"role": "assistant", "content": "77"},
]


def render(tokenizer: Any, messages: list[dict[str, Any]], **options: Any) -> Any:
    (example,) = render_sft_examples([{"messages": messages}], tokenizer, max_prompt_tokens=64, **options)
    return example


def trained(tokenizer: Any, example: Any) -> list[int]:
    return [t for t, m in zip(example.response_ids, example.loss_mask, strict=True) if m]


def test_weight_zero_leaves_the_turn_out_of_the_loss_and_in_the_ids(tokenizer: Any) -> None:
    full = render(tokenizer, GAME)
    weighted = render(tokenizer, [GAME[0], {**GAME[1], "weight": 0}, GAME[2], {**GAME[3], "weight": 1}])
    chat = ChatTokens(tokenizer)
    assert weighted.prompt_ids == full.prompt_ids and weighted.response_ids == full.response_ids
    assert trained(tokenizer, full) == [*chat.turn_ids("3"), *chat.turn_ids("77")]
    assert trained(tokenizer, weighted) == chat.turn_ids("77")  # the first guess: seen, not trained


def test_turn_end_loss_false_masks_each_turns_eos_only(tokenizer: Any) -> None:
    example, full = render(tokenizer, GAME, turn_end_loss=False), render(tokenizer, GAME)
    assert example.response_ids == full.response_ids
    assert trained(tokenizer, example) == tokenizer.encode("377", add_special_tokens=False)
    dropped = [
        t for t, a, b in zip(full.response_ids, full.loss_mask, example.loss_mask, strict=True) if a > b
    ]
    assert dropped == [tokenizer.eos_token_id] * 2  # one per model turn, nothing else


def test_the_pattern_word_alone_in_the_loss(tokenizer: Any) -> None:
    """The vision example's stage 1: earlier turns at weight 0, EOS out: the loss is on the last text."""
    example = render(tokenizer, [GAME[0], {**GAME[1], "weight": 0}, *GAME[2:]], turn_end_loss=False)
    assert trained(tokenizer, example) == tokenizer.encode("77", add_special_tokens=False)


def test_pairs_leave_their_closing_eos_out_with_turn_end_loss_false(tokenizer: Any) -> None:
    row = {"prompt": "1+1=", "response": "2"}
    (pair,) = render_sft_examples([row], tokenizer, max_prompt_tokens=64, turn_end_loss=False)
    assert pair.response_ids[-1] == tokenizer.eos_token_id
    assert pair.loss_mask == [1] * (len(pair.response_ids) - 1) + [0]


@pytest.mark.parametrize("weight", [0.5, "1", True, -1])
def test_bad_weights_name_row_field_value_and_fix(tokenizer: Any, weight: Any) -> None:
    rows = [{"messages": GAME}, {"messages": [*GAME[:3], {**GAME[3], "weight": weight}]}]
    with pytest.raises(DataError) as err:
        render_sft_examples(rows, tokenizer, max_prompt_tokens=64, source="sft.jsonl")
    assert str(err.value) == (
        f"sft.jsonl row 2: field 'messages' message 3 'weight' is {weight!r}; use 0 (leave this turn out of "
        "the loss) or 1 (train on it)."
    )


def test_a_weight_on_a_user_message_or_on_no_trained_turn_is_refused(tokenizer: Any) -> None:
    rows = [
        {"messages": [{**GAME[0], "weight": 1}, *GAME[1:]]},
        {"messages": [GAME[0], {**GAME[1], "weight": 0}, GAME[2], {**GAME[3], "weight": 0}]},
    ]
    with pytest.raises(DataError) as err:
        render_sft_examples(rows, tokenizer, max_prompt_tokens=64, source="sft.jsonl")
    problems = err.value.problems
    assert problems[0].startswith("row 1: field 'messages' message 0 'weight' is set on a 'user' message")
    assert problems[1].startswith("row 2: field 'messages': every assistant message has weight 0")
    assert "give at least one assistant message weight 1" in problems[1]


def test_no_loss_leaves_the_named_text_out_of_the_loss_and_in_the_ids(tokenizer: Any) -> None:
    """The vision example's stage 2: the call trained, where it zooms (a substring of the turn) not."""
    call = {"role": "assistant", "content": "zoom(0.5, 0.0)!"}
    full = render(tokenizer, [GAME[0], call, *GAME[2:]])
    example = render(tokenizer, [GAME[0], {**call, "no_loss": ["0.5, 0.0"]}, *GAME[2:]])
    assert example.response_ids == full.response_ids
    dropped = [
        t for t, a, b in zip(full.response_ids, full.loss_mask, example.loss_mask, strict=True) if a > b
    ]
    assert dropped == tokenizer.encode("0.5, 0.0", add_special_tokens=False)
    chat = ChatTokens(tokenizer)
    assert trained(tokenizer, example) == [
        *tokenizer.encode("zoom()!", add_special_tokens=False),
        tokenizer.eos_token_id,
        *chat.turn_ids("77"),
    ]


def test_bad_no_loss_names_row_field_value_and_fix(tokenizer: Any) -> None:
    rows = [
        {"messages": [GAME[0], {**GAME[1], "no_loss": ["4"]}, *GAME[2:]]},
        {"messages": [{**GAME[0], "no_loss": ["0"]}, *GAME[1:]]},
        {"messages": [GAME[0], {**GAME[1], "no_loss": "3"}, *GAME[2:]]},
    ]
    with pytest.raises(DataError) as err:
        render_sft_examples(rows, tokenizer, max_prompt_tokens=64, source="sft.jsonl")
    assert err.value.problems == [
        "row 1: field 'messages' message 1 'no_loss': '4' is not in the message's content; fix or remove it.",
        "row 2: field 'messages' message 0 'no_loss' is set on a 'user' message; only assistant messages take it.",
        "row 3: field 'messages' message 1 'no_loss' is '3'; use a list of non-empty substrings of the message's "
        "content.",
    ]
