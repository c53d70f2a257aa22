"""render_sft_examples: prompts render like RL prompts, responses end in EOS, limits are enforced visibly."""

from __future__ import annotations

import pytest

from ascent.data import DataError, render_prompts, render_sft_examples, render_sft_examples_and_report


def test_pair_layout(tokenizer):
    rows = [{"prompt": "2+2?", "response": "4 #### 4"}]
    (example,), report = render_sft_examples_and_report(rows, tokenizer, max_prompt_tokens=64)
    (item,), _ = render_prompts(rows, tokenizer, max_prompt_tokens=64)
    assert example.prompt_ids == item.prompt_ids
    assert example.response_ids == tokenizer.encode("4 #### 4", add_special_tokens=False) + [
        tokenizer.eos_token_id
    ]
    assert example.response_ids.count(tokenizer.eos_token_id) == 1
    assert example.num_tokens == len(item.prompt_ids) + 9 and report.kept == 1


def test_custom_response_key_and_messages(tokenizer):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "target": "yo"}]
    (example,) = render_sft_examples(rows, tokenizer, response_key="target", max_prompt_tokens=64)
    assert tokenizer.decode(example.response_ids) == "yo<|im_end|>"


def test_response_problems_name_the_row(tokenizer):
    rows = [
        {"prompt": "a", "response": "ok"},
        {"prompt": "b"},
        {"prompt": "c", "response": 3},
        {"prompt": "d", "response": ""},
    ]
    with pytest.raises(DataError) as info:
        render_sft_examples(rows, tokenizer, max_prompt_tokens=64, source="data.train_path=s.jsonl")
    assert info.value.problems == [
        "row 2: field 'response' is missing; every SFT row needs a target response (or set response_key).",
        "row 3: field 'response' has type int; the response must be a string.",
        "row 4: field 'response' is empty; every SFT row needs a non-empty response.",
    ]


ROWS = [{"prompt": "a", "response": "x" * 3}, {"prompt": "b", "response": "y" * 20}]  # prompt 6 tokens


def test_total_limit_drop_and_truncate(tokenizer):
    kept, report = render_sft_examples_and_report(ROWS, tokenizer, max_prompt_tokens=64, max_total_tokens=12)
    assert [e.row_id for e in kept] == [0] and report.dropped == 1
    cut, report = render_sft_examples_and_report(
        ROWS, tokenizer, max_prompt_tokens=64, max_total_tokens=12, overlong="truncate"
    )
    assert (
        report.truncated == 1 and cut[1].num_tokens == 12 and tokenizer.decode(cut[1].response_ids) == "y" * 6
    )


def test_total_limit_error(tokenizer):
    with pytest.raises(DataError, match="row 2: prompt \\+ response is 27 tokens, over max_total_tokens=12"):
        render_sft_examples(ROWS, tokenizer, max_prompt_tokens=64, max_total_tokens=12, overlong="error")


def test_plain_variant_logs_what_it_dropped(tokenizer, caplog):
    with caplog.at_level("WARNING", logger="ascent.data.sft"):
        kept = render_sft_examples(
            ROWS, tokenizer, max_prompt_tokens=64, max_total_tokens=12, source="s.jsonl"
        )
    assert [e.row_id for e in kept] == [0]
    assert "s.jsonl: SFT pairs: 1/2 prompts kept; 1 dropped" in caplog.text


def test_prompts_are_validated_too(tokenizer):
    with pytest.raises(DataError, match="row 1: field 'prompt' is missing"):
        render_sft_examples([{"response": "x"}], tokenizer, max_prompt_tokens=64)
