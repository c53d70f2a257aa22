"""SFT rows written for the OpenAI API: assistant `tool_calls` (content null, "" or text) and `tool` results
(text, or parts with an image) train on the same ids as the calls written as text in the model family's own
format, with the call's tokens in the loss; a malformed call is refused naming the row, the field and the fix,
never dropped."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from ascent.data import image_codec, render_prompts, render_sft_examples_and_report, validate_rows
from ascent.data.validation import DataError
from ascent.models.tiny import DEFAULT_CHARS, make_char_tokenizer
from tests.unit.chat_templates import QWEN25_TEMPLATE
from tests.unit.vl_files import png_bytes

CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny Qwen2.5 tokenizer: Qwen's chat template, its `<tool_call>` words, braces."""
    path = tmp_path_factory.mktemp("qwen25_tools")
    words = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    make_char_tokenizer(path, chars=DEFAULT_CHARS + "{}", words=words, chat_template=QWEN25_TEMPLATE)
    return AutoTokenizer.from_pretrained(str(path))


def _call(arguments: Any, name: Any = "add") -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def _conversation(assistant: dict[str, Any], result: Any = "3") -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "1+2?"},
        assistant,
        {"role": "tool", "tool_call_id": "c1", "content": result},
        {"role": "assistant", "content": "3"},
    ]


def _render(tok: Any, rows: list[dict[str, Any]], **options: Any) -> Any:
    options = {"max_prompt_tokens": 512, "source": "sft.jsonl", **options}
    return render_sft_examples_and_report(rows, tok, **options)[0]


def _trained(tok: Any, example: Any) -> str:
    kept = [t for t, m in zip(example.response_ids, example.loss_mask, strict=True) if m]
    return str(tok.decode(kept))


@pytest.mark.parametrize(
    ("content", "arguments", "text"),
    [
        (None, '{"a": 1, "b": 2}', CALL_TEXT),
        ("", {"a": 1, "b": 2}, CALL_TEXT),
        ("Let me add.", '{"a": 1, "b": 2}', "Let me add.\n" + CALL_TEXT),
    ],
)
def test_openai_tool_calls_train_on_the_ids_of_the_call_written_as_text(
    qwen: Any, content: Any, arguments: Any, text: str
) -> None:
    openai = _conversation({"role": "assistant", "content": content, "tool_calls": [_call(arguments)]})
    written = _conversation({"role": "assistant", "content": text})
    (got, want) = _render(qwen, [{"messages": openai}, {"messages": written}])
    assert (got.prompt_ids, got.response_ids, got.loss_mask) == (
        want.prompt_ids,
        want.response_ids,
        want.loss_mask,
    )
    assert _trained(qwen, got) == text + "<|im_end|>3<|im_end|>"  # the call is in the loss, the result not
    assert "<tool_response>\n3\n</tool_response>" in qwen.decode(got.response_ids)


def test_weight_zero_and_turn_end_loss_apply_to_a_call_turn(qwen: Any) -> None:
    call = {"role": "assistant", "content": None, "tool_calls": [_call('{"a": 1, "b": 2}')]}
    (unweighted,) = _render(qwen, [{"messages": _conversation({**call, "weight": 0})}])
    assert _trained(qwen, unweighted) == "3<|im_end|>"
    (no_end,) = _render(qwen, [{"messages": _conversation(call)}], turn_end_loss=False)
    assert _trained(qwen, no_end) == CALL_TEXT + "3"


def test_several_calls_in_one_turn_keep_their_order(qwen: Any) -> None:
    calls = [_call({"a": 1, "b": 2}), {**_call('{"x": "y"}', "echo"), "id": "c2"}]
    messages = _conversation({"role": "assistant", "content": None, "tool_calls": calls})
    messages.insert(3, {"role": "tool", "tool_call_id": "c2", "content": "y"})
    (example,) = _render(qwen, [{"messages": messages}])
    echo = '<tool_call>\n{"name": "echo", "arguments": {"x": "y"}}\n</tool_call>'
    assert _trained(qwen, example).startswith(CALL_TEXT + "\n" + echo + "<|im_end|>")


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (_call("{a: 1}"), "message 1: tool_calls[0].function.arguments is '{a: 1}', not JSON"),
        (_call("[1, 2]"), "message 1: tool_calls[0].function.arguments is list"),
        (_call({}, name=""), "message 1: tool_calls[0].function.name is ''; give the called function's name"),
        ({"id": "c1", "type": "function"}, "message 1: tool_calls[0] has no 'function' object"),
    ],
)
def test_malformed_tool_calls_are_refused_naming_row_field_and_fix(
    qwen: Any, call: dict[str, Any], expected: str
) -> None:
    good = _conversation({"role": "assistant", "content": CALL_TEXT})
    bad = _conversation({"role": "assistant", "content": None, "tool_calls": [call]})
    with pytest.raises(DataError) as err:
        _render(qwen, [{"messages": good}, {"messages": bad}])
    assert "sft.jsonl: row 2: field 'messages' " + expected in str(err.value)
    assert err.value.exit_code == 2


def test_a_template_that_renders_no_calls_is_refused_not_dropped(tokenizer: Any) -> None:
    messages = _conversation({"role": "assistant", "content": "", "tool_calls": [_call("{}")]})
    with pytest.raises(DataError, match="row 1: .*does not render assistant 'tool_calls'.*as text"):
        _render(tokenizer, [{"messages": messages}])


def test_a_null_content_without_tool_calls_is_refused(qwen: Any) -> None:
    messages = _conversation({"role": "assistant", "content": None})
    with pytest.raises(DataError, match="row 1: field 'messages' message 1: 'content' is missing"):
        _render(qwen, [{"messages": messages}])


def test_prompt_rows_accept_openai_tool_calls_too(qwen: Any) -> None:
    history = _conversation({"role": "assistant", "content": None, "tool_calls": [_call('{"a": 1, "b": 2}')]})
    written = _conversation({"role": "assistant", "content": CALL_TEXT})
    rows = [{"prompt": history[:3]}, {"prompt": written[:3]}]
    (got, want), _ = render_prompts(rows, qwen, max_prompt_tokens=512)
    assert got.prompt_ids == want.prompt_ids and CALL_TEXT in qwen.decode(got.prompt_ids)
    bad = [{"prompt": _conversation({"role": "assistant", "content": None, "tool_calls": [_call("x")]})}]
    with pytest.raises(DataError) as err:
        validate_rows(bad, "train.jsonl")  # what loading a prompt file runs before rendering
    assert "row 1: field 'prompt' message 1: tool_calls[0].function.arguments is 'x', not JSON" in str(
        err.value
    )


def test_an_image_in_a_tool_result_after_an_openai_call(tmp_path: Any, vl_processor_dir: Any) -> None:
    tok = AutoTokenizer.from_pretrained(str(vl_processor_dir))
    tok.chat_template = QWEN25_TEMPLATE  # a vision-language template that renders tool calls, as Qwen3-VL's
    codec = image_codec(str(vl_processor_dir))
    (tmp_path / "crop.png").write_bytes(png_bytes(30, 30, 3))
    result = [{"type": "image", "image": str(tmp_path / "crop.png")}, {"type": "text", "text": "crop"}]
    call = {"role": "assistant", "content": None, "tool_calls": [_call('{"a": 1, "b": 2}')]}
    rows = [
        {"messages": _conversation(call, result)},
        {"messages": _conversation({"role": "assistant", "content": CALL_TEXT}, result)},
    ]
    got, want = _render(tok, rows, codec=codec)
    assert (got.prompt_ids, got.response_ids, got.loss_mask) == (
        want.prompt_ids,
        want.response_ids,
        want.loss_mask,
    )
    pad = codec.image_token_id
    assert got.response_ids.count(pad) == got.images[0].num_tokens > 0
    assert all(m == 0 for t, m in zip(got.response_ids, got.loss_mask, strict=True) if t == pad)
    assert _trained(tok, got) == _trained(tok, want) and "tool_call" in _trained(tok, got)


def test_an_empty_tool_calls_list_is_a_turn_without_calls(qwen: Any) -> None:
    (empty, plain) = _render(
        qwen,
        [
            {"messages": _conversation({"role": "assistant", "content": CALL_TEXT, "tool_calls": []})},
            {"messages": _conversation({"role": "assistant", "content": CALL_TEXT})},
        ],
    )
    assert empty.response_ids == plain.response_ids and empty.loss_mask == plain.loss_mask
