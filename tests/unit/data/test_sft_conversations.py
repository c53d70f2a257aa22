"""SFT on whole conversations: a demonstration trains on exactly the ids an episode of the same conversation
samples (prompt, model turns with their end-of-turn token, observations as the template's continuation), with
the loss on the model's turns only; malformed conversations are refused with the row named."""

from __future__ import annotations

from typing import Any

import pytest

from ascent.data import render_sft_examples
from ascent.data.validation import DataError
from ascent.envs import ChatTokens, GuessNumber, Task, run_episodes
from ascent.messages import Generation, GenerationRequest, SamplingParams

GAME = [
    {"role": "user", "content": "Guess my number from 0 to 9."},
    {"role": "assistant", "content": "3"},
    {"role": "user", "content": "higher"},
    {"role": "assistant", "content": "7"},
]


def scripted(chat: ChatTokens, turns: list[str]) -> Any:
    """An engine that answers turn t of every episode with `turns[t]` and its end-of-turn token."""
    calls = iter(turns)

    def generate(requests: list[GenerationRequest]) -> list[list[Generation]]:
        ids = chat.turn_ids(next(calls))
        return [[Generation(ids, [-0.5] * len(ids), "stop")] for _ in requests]

    return generate


def test_a_conversation_encodes_as_the_episode_that_plays_it(tokenizer: Any) -> None:
    chat = ChatTokens(tokenizer)
    (episode,) = run_episodes(
        [Task(GuessNumber(), {"target": 7}, 0)],
        scripted(chat, ["3", "7"]),
        chat,
        SamplingParams(max_new_tokens=4),
        max_turns=4,
        max_tokens=64,
    )
    (example,) = render_sft_examples([{"messages": GAME}], tokenizer, max_prompt_tokens=64)
    assert episode.reward == 1.0
    assert example.prompt_ids == episode.prompt_ids
    assert example.response_ids == episode.response_ids
    assert example.loss_mask == episode.loss_mask
    assert 0 in example.loss_mask and example.loss_mask[-1] == 1  # the world's answer is out of the loss


def test_pairs_keep_no_mask_and_truncation_cuts_the_mask_too(tokenizer: Any) -> None:
    (pair,) = render_sft_examples([{"prompt": "1+1=", "response": "2"}], tokenizer, max_prompt_tokens=64)
    assert pair.loss_mask is None
    (full,) = render_sft_examples([{"messages": GAME}], tokenizer, max_prompt_tokens=64)
    (cut,) = render_sft_examples(
        [{"messages": GAME}],
        tokenizer,
        max_prompt_tokens=64,
        max_total_tokens=len(full.prompt_ids) + 3,
        overlong="truncate",
    )
    assert cut.response_ids == full.response_ids[:3]
    assert cut.loss_mask == full.loss_mask[:3]  # type: ignore[index]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([{"messages": GAME[:3]}], "must end with an assistant turn"),
        ([{"messages": GAME[1:]}], "at least one message before the first assistant turn"),
        ([{"messages": [{"role": "user"}]}], "message 0: 'content' is missing"),
        ([{"messages": [{"role": 1}]}], "list of {role, content} messages"),
        ([{"messages": GAME}, {"prompt": "1+1=", "response": "2"}], "row 1 is a conversation"),
    ],
)
def test_malformed_conversations_are_refused(tokenizer: Any, rows: list[dict], expected: str) -> None:
    with pytest.raises(DataError, match="row") as err:
        render_sft_examples(rows, tokenizer, max_prompt_tokens=64, source="sft.jsonl")
    assert expected in str(err.value) and "sft.jsonl" in str(err.value)


def test_conversations_need_a_chat_template(plain_tokenizer: Any) -> None:
    with pytest.raises(DataError, match="chat template"):
        render_sft_examples([{"messages": GAME}], plain_tokenizer, max_prompt_tokens=64)
