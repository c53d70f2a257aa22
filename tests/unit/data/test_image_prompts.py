"""Rows whose messages show images: each image becomes its token count of image pads and travels with the
prompt; a missing or unreadable image costs its row (named, counted), never the run; SFT conversations with
tool calls and tool-returned images keep the loss on the assistant's tokens."""

from __future__ import annotations

import base64
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from transformers import AutoTokenizer

from ascent.data import DataError, image_codec, load_prompts, render_prompts, render_sft_examples_and_report
from ascent.data.loading import load_rows
from tests.unit.vl_files import png_bytes


@pytest.fixture(scope="module")
def vl(vl_processor_dir):
    return AutoTokenizer.from_pretrained(str(vl_processor_dir)), image_codec(str(vl_processor_dir))


def _user(*parts):
    return [{"role": "user", "content": list(parts)}]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_image_rows_render_pads_and_carry_images(tmp_path, vl):
    tok, codec = vl
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "big.png").write_bytes(png_bytes(300, 200))
    url = "data:image/png;base64," + base64.b64encode(png_bytes(20, 20, 1)).decode()
    rows = [
        {
            "prompt": _user({"type": "image", "image": "img/big.png"}, {"type": "text", "text": "what?"}),
            "answer": "a",
        },
        {"prompt": _user({"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x"})},
        {"prompt": _user({"type": "text", "text": "no image here"})},
    ]
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    items, report = load_prompts(str(data), tok, source="data.train_path", max_prompt_tokens=512, codec=codec)
    assert [len(i.images) for i in items] == [1, 1, 0]
    big, small = items[0].images[0], items[1].images[0]
    assert small.num_tokens == 4 and big.num_tokens > small.num_tokens  # the pixel budget decides
    assert big.source == str(tmp_path / "img" / "big.png")
    for item in items[:2]:
        pads = item.prompt_ids.count(codec.image_token_id)
        assert pads == item.images[0].num_tokens
    assert items[0].metadata == {"answer": "a"}
    assert report.image_tokens == [big.num_tokens, 4] and not report.bad_images


def test_a_missing_image_costs_its_row_with_row_number_and_path(tmp_path, vl, caplog):
    tok, codec = vl
    (tmp_path / "ok.png").write_bytes(png_bytes(30, 30))
    rows = [
        {"prompt": _user({"type": "image", "image": "ok.png"})},
        {"prompt": _user({"type": "image", "image": "gone.png"})},
        {"prompt": _user({"type": "image", "image": "ok.png"})},
    ]
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="ascent"):
        items, report = load_prompts(
            str(data), tok, source="data.train_path", max_prompt_tokens=512, codec=codec
        )
    assert [i.row_id for i in items] == [0, 2]
    assert report.dropped == 1 and report.dropped_row_ids == [1]
    assert report.bad_images == [
        f"row 2: image {tmp_path / 'gone.png'}: no such file (the row writes 'gone.png', resolved against the "
        f"dataset file's folder {tmp_path}); give an absolute path or a path relative to that folder"
    ]
    assert "row 2: image" in caplog.text and "gone.png" in caplog.text
    assert "; 2 images of 4..4 image tokens; 1 left out for an unusable image" in report.summary()


def test_an_image_row_over_the_prompt_limit_costs_its_row_naming_max_pixels(tmp_path, vl, caplog):
    tok, codec = vl
    (tmp_path / "small.png").write_bytes(png_bytes(28, 28))  # 4 image tokens
    (tmp_path / "big.png").write_bytes(png_bytes(600, 600))  # capped by the pixel budget
    big = codec.encode(Image.open(tmp_path / "big.png")).num_tokens
    rows = [
        {"prompt": _user({"type": "image", "image": str(tmp_path / n)}, {"type": "text", "text": "hi"})}
        for n in ("small.png", "big.png")
    ]
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    for overlong in ("drop", "truncate"):  # never cut: that would split an image
        with caplog.at_level(logging.WARNING, logger="ascent"):
            items, report = load_prompts(
                str(data), tok, source="s", max_prompt_tokens=40, overlong=overlong, codec=codec
            )
        assert [i.row_id for i in items] == [0] and report.truncated == 0 and report.dropped_row_ids == [1]
        (problem,) = report.overlong_images
        assert (
            problem.startswith("row 2: the prompt is ")
            and f"{big} of them image tokens (1 images: {big})" in problem
        )
        assert "over data.max_prompt_tokens=40; lower model.max_pixels" in problem
        assert "row 2: the prompt is" in caplog.text and "1 with images over the limit" in report.summary()
    with pytest.raises(DataError, match="row 2: the prompt is .* lower model.max_pixels"):
        load_prompts(str(data), tok, source="s", max_prompt_tokens=40, overlong="error", codec=codec)
    sft = [{**r, "response": "ok"} for r in rows]
    _, report = render_sft_examples_and_report(
        sft, tok, max_prompt_tokens=40, overlong="truncate", codec=codec
    )
    assert report.dropped_row_ids == [1] and report.overlong_images[0].startswith("row 2: the prompt is")


def test_every_row_bad_is_the_no_usable_rows_error(tmp_path, vl):
    tok, codec = vl
    (tmp_path / "junk.png").write_bytes(b"not a png")
    rows = [{"prompt": _user({"type": "image", "image": "junk.png"})}] * 2
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match="all 2 rows were left out for an unusable image"):
        load_prompts(str(data), tok, source="data.train_path", max_prompt_tokens=512, codec=codec)


def test_parquet_images_column_of_bytes(tmp_path, vl):
    tok, codec = vl
    prompt = _user({"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"})
    table = pa.table(
        {
            "prompt": [prompt],
            "images": [
                [{"bytes": png_bytes(40, 40), "path": "a.png"}, {"bytes": png_bytes(20, 20), "path": None}]
            ],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    (item,), _ = load_prompts(
        str(tmp_path / "d.parquet"), tok, source="d", max_prompt_tokens=512, codec=codec
    )
    assert len(item.images) == 2 and "images" not in item.metadata
    assert item.prompt_ids.count(codec.image_token_id) == sum(im.num_tokens for im in item.images)


def test_a_text_model_refuses_image_rows_naming_the_fix(tokenizer):
    rows = [{"prompt": _user({"type": "image", "image": "/x.png"})}]
    with pytest.raises(DataError, match="text-only model.*vision-language checkpoint"):
        render_prompts(rows, tokenizer, max_prompt_tokens=64)


def test_a_url_in_the_data_is_a_validation_error(tmp_path, vl):
    tok, codec = vl
    rows = [{"prompt": _user({"type": "image_url", "image_url": {"url": "http://x/y.png"}})}]
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match="row 1.*never downloads"):
        load_prompts(str(data), tok, source="data.train_path", max_prompt_tokens=512, codec=codec)


def test_sft_conversation_with_a_tool_call_returning_an_image(tmp_path, vl):
    tok, codec = vl
    (tmp_path / "page.png").write_bytes(png_bytes(60, 60))
    (tmp_path / "crop.png").write_bytes(png_bytes(30, 30, 3))
    messages = [
        {
            "role": "user",
            "content": [{"type": "image", "image": "page.png"}, {"type": "text", "text": "read"}],
        },
        {"role": "assistant", "content": "<tool_call>zoom</tool_call>"},
        {"role": "tool", "content": [{"type": "image", "image": "crop.png"}]},
        {"role": "assistant", "content": "42"},
    ]
    rows = load_rows(_write_jsonl(tmp_path / "s.jsonl", [{"messages": messages}]))
    (ex,), _ = render_sft_examples_and_report(rows, tok, max_prompt_tokens=512, codec=codec)
    pad = codec.image_token_id
    page, crop = ex.images
    assert ex.prompt_ids.count(pad) == page.num_tokens and ex.response_ids.count(pad) == crop.num_tokens
    assert all(m == 0 for t, m in zip(ex.response_ids, ex.loss_mask, strict=True) if t == pad)
    trained = [t for t, m in zip(ex.response_ids, ex.loss_mask, strict=True) if m]
    assert tok.decode(trained).replace("<|im_end|>", "|") == "<tool_call>zoom</tool_call>|42|"


def test_a_pixel_budget_for_a_text_model_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert image_codec(str(tmp_path)) is None
    with pytest.raises(DataError, match="model.max_pixels=1000: .* is a text-only model"):
        image_codec(str(tmp_path), max_pixels=1000)
