"""render_prompts: chat templates, raw encoding, pre-tokenized rows and the over-long prompt policies."""

from __future__ import annotations

import json

import pytest

from ascent.config.schema import DataConfig
from ascent.data import DataError, load_prompts, prompts_from_config, render_prompts

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_string_prompt_goes_through_chat_template(tokenizer):
    rows = [{"prompt": "2+2?", "answer": "4", "data_source": "toy"}]
    (item,), report = render_prompts(rows, tokenizer, max_prompt_tokens=64)
    expected = f"{IM_START}u2+2?{IM_END}{IM_START}a"
    assert item.prompt_text == expected
    assert item.prompt_ids == ids_of(tokenizer, expected)
    assert item.prompt_ids[0] == tokenizer.convert_tokens_to_ids(IM_START)
    assert item.row_id == 0 and item.metadata == {"answer": "4", "data_source": "toy"}
    assert (report.total, report.kept, report.dropped, report.truncated) == (1, 1, 0, 0)


def test_raw_encoding_without_chat_template(tokenizer):
    (item,), _ = render_prompts([{"prompt": "2+2?"}], tokenizer, max_prompt_tokens=64, chat_template=False)
    assert item.prompt_text == "2+2?"
    assert item.prompt_ids == ids_of(tokenizer, "2+2?") and len(item.prompt_ids) == 4


def test_messages_always_use_the_template_with_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    (item,), _ = render_prompts([{"prompt": messages}], tokenizer, max_prompt_tokens=64, chat_template=False)
    assert item.prompt_text == f"{IM_START}sBe brief.{IM_END}{IM_START}uhi{IM_END}{IM_START}a"


def test_prompt_ids_are_used_as_given(tokenizer):
    ids = ids_of(tokenizer, "abc")
    (item,), _ = render_prompts([{"prompt": "ignored", "prompt_ids": ids}], tokenizer, max_prompt_tokens=8)
    assert item.prompt_ids == ids and item.prompt_text == "abc" and "prompt_ids" not in item.metadata


ROWS = [
    {"prompt": "a" * 3},
    {"prompt": "b" * 20},
    {"prompt": "c" * 4},
]  # 8, 25 and 9 tokens with the template


def test_overlong_drop_counts(tokenizer):
    items, report = render_prompts(ROWS, tokenizer, max_prompt_tokens=10, overlong="drop")
    assert [i.row_id for i in items] == [0, 2]
    assert (report.dropped, report.truncated, report.longest, report.dropped_row_ids) == (1, 0, 25, [1])
    assert "2/3 prompts kept; 1 dropped" in report.summary()


@pytest.mark.parametrize("side", ["left", "right"])
def test_overlong_truncate(tokenizer, side):
    items, report = render_prompts(
        ROWS, tokenizer, max_prompt_tokens=10, overlong="truncate", truncation_side=side
    )
    full = ids_of(tokenizer, f"{IM_START}u{'b' * 20}{IM_END}{IM_START}a")
    assert report.truncated == 1 and report.dropped == 0 and len(items) == 3
    assert items[1].prompt_ids == (full[-10:] if side == "left" else full[:10])
    assert items[1].prompt_text == tokenizer.decode(items[1].prompt_ids)
    if side == "left":
        assert items[1].prompt_text.endswith(f"{IM_END}{IM_START}a")  # the generation prompt survives


def test_overlong_error_names_row_length_and_fix(tokenizer):
    with pytest.raises(DataError) as info:
        render_prompts(
            ROWS, tokenizer, max_prompt_tokens=10, overlong="error", source="data.train_path=t.jsonl"
        )
    message = str(info.value)
    assert message.startswith(
        "data.train_path=t.jsonl row 2: prompt is 25 tokens, over data.max_prompt_tokens=10"
    )
    assert "raise data.max_prompt_tokens or set data.overlong_prompts to drop or truncate" in message


def test_all_dropped_is_an_error(tokenizer):
    with pytest.raises(DataError, match="all 3 prompts are over data.max_prompt_tokens=2"):
        render_prompts(ROWS, tokenizer, max_prompt_tokens=2)


def test_missing_chat_template(plain_tokenizer):
    messages = [{"prompt": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(DataError, match="no chat template, but prompts are message lists"):
        render_prompts(messages, plain_tokenizer, max_prompt_tokens=64)
    with pytest.raises(DataError, match="set data.chat_template=false"):
        render_prompts([{"prompt": "hi"}], plain_tokenizer, max_prompt_tokens=64)
    (item,), _ = render_prompts(
        [{"prompt": "hi"}], plain_tokenizer, max_prompt_tokens=64, chat_template=False
    )
    assert item.prompt_text == "hi"


def test_load_prompts_and_from_config(tokenizer, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        "\n".join(json.dumps({"prompt": p, "answer": str(i)}) for i, p in enumerate(["x", "y" * 50, "z"]))
    )
    cfg = DataConfig(train_path=str(path), val_path=str(path), max_prompt_tokens=16, max_val_prompts=1)
    items, report = prompts_from_config(cfg, tokenizer)
    assert [i.metadata["answer"] for i in items] == ["0", "2"] and report.dropped == 1
    val_items, _ = prompts_from_config(cfg, tokenizer, split="val")
    assert len(val_items) == 1
    with pytest.raises(DataError, match=rf"data.train_path={path} row 2: prompt is 55 tokens"):
        load_prompts(
            str(path), tokenizer, source=f"data.train_path={path}", max_prompt_tokens=16, overlong="error"
        )


def test_from_config_unset_val_path(tokenizer):
    with pytest.raises(DataError, match="data.val_path is not set"):
        prompts_from_config(DataConfig(train_path="x.jsonl"), tokenizer, split="val")
