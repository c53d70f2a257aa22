"""Field mapping (data.prompt_key / answer_key), the config's system prompt, chat templates by file or name,
and rows from a saved Hugging Face `datasets` directory."""

from __future__ import annotations

import pytest

from ascent.data import DataError, load_rows, render_prompts
from ascent.data.fields import add_system_prompt, map_fields, prepare_rows
from ascent.data.templates import CHAT_TEMPLATES, resolve_chat_template, set_chat_template

SRC = "data.train_path=x.jsonl"


def test_prompt_and_answer_keys_rename_the_columns():
    rows = [{"question": "1+1=", "solution": "2", "id": 7}]
    assert map_fields(rows, SRC, "question", "solution") == [{"prompt": "1+1=", "answer": "2", "id": 7}]
    assert map_fields(rows, SRC) is rows  # the default names change nothing


def test_a_missing_prompt_key_names_the_key_and_the_columns():
    rows = [{"question": "a"}, {"text": "b"}]
    with pytest.raises(DataError, match=r"row 2: data.prompt_key='question'.*the file has question, text"):
        map_fields(rows, SRC, prompt_key="question")
    with pytest.raises(DataError, match=r"data.answer_key='sol'.*the file has question"):
        map_fields([{"question": "a"}], SRC, "question", "sol")


def test_a_key_beside_the_target_column_is_refused():
    with pytest.raises(DataError, match="has a 'prompt' column too"):
        map_fields([{"prompt": "a", "question": "b"}], SRC, prompt_key="question")


def test_system_prompt_goes_before_string_and_message_prompts_images_kept():
    image = {"type": "image", "image": "/x.png"}
    rows = [
        {"prompt": "hi"},
        {"prompt": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}]},
    ]
    out = add_system_prompt(rows, "Be brief.", SRC)
    system = {"role": "system", "content": "Be brief."}
    assert out[0]["prompt"] == [system, {"role": "user", "content": "hi"}]
    assert out[1]["prompt"][0] == system and out[1]["prompt"][1]["content"][0] == image
    assert rows[0]["prompt"] == "hi"  # the input rows are not edited


def test_system_prompt_refuses_a_row_with_its_own():
    rows = [{"prompt": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]}]
    with pytest.raises(DataError, match="row 1: the prompt already starts with a system message"):
        add_system_prompt(rows, "Be brief.", SRC)


def test_system_prompt_reaches_the_rendered_prompt(tokenizer):
    rows = prepare_rows([{"q": "2+2="}], SRC, prompt_key="q", system_prompt="S!")
    items, _ = render_prompts(rows, tokenizer, max_prompt_tokens=256)
    assert "S!" in items[0].prompt_text and items[0].prompt_text.index("S!") < items[0].prompt_text.index(
        "2+2="
    )


def test_chat_template_by_name_and_by_file(tmp_path, tokenizer_dir):
    from transformers import AutoTokenizer

    assert resolve_chat_template("chatml") == CHAT_TEMPLATES["chatml"]
    file = tmp_path / "t.jinja"
    file.write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}>")
    tok = set_chat_template(AutoTokenizer.from_pretrained(str(tokenizer_dir)), str(file))
    items, _ = render_prompts([{"prompt": "ab"}], tok, max_prompt_tokens=256)
    assert items[0].prompt_text == "[user]ab>"


def test_chat_template_errors_name_the_field(tmp_path):
    with pytest.raises(DataError, match=r"model.chat_template='nope.jinja': no file at .*nope.jinja"):
        resolve_chat_template("nope.jinja")
    with pytest.raises(DataError, match="not a built-in name nor a file; .* chatml"):
        resolve_chat_template("llama9")
    (tmp_path / "e.jinja").write_text(" ")
    with pytest.raises(DataError, match="the file is empty"):
        resolve_chat_template(str(tmp_path / "e.jinja"))


def test_a_saved_datasets_directory_round_trips(tmp_path):
    import datasets  # an optional dependency (ascent[datasets]) that the dev install holds; slow to import

    rows = [{"question": "1+1=", "solution": "2"}, {"question": "2+3=", "solution": "5"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    assert load_rows(tmp_path / "one") == rows
    splits = {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "two"))
    assert load_rows(tmp_path / "two", split="test") == rows[:1]
    with pytest.raises(DataError, match=r"data.split=None is not a split .*\(it has train, test\)"):
        load_rows(tmp_path / "two")
    with pytest.raises(DataError, match="not a saved `datasets` dataset"):
        load_rows(tmp_path)


def test_row_fields_read_a_file_as_eval_does(tmp_path):
    from ascent.data.fields import RowFields

    file = tmp_path / "rows.jsonl"
    file.write_text('{"question": "1+1=", "solution": "2"}\n')
    rows = RowFields(prompt_key="question", answer_key="solution", system_prompt="S").rows(str(file))
    assert rows == [
        {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1="}], "answer": "2"}
    ]
