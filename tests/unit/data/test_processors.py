"""Data processors: filter, transform, difficulty (a column, an earlier run's store) and plug-ins, run in
order on the rows; what each kept is logged, errors name the processor, keeping no row is an error."""

from __future__ import annotations

import json
import logging

import pytest

from ascent.config import RunConfig, SFTConfig
from ascent.config.schema import DataConfig
from ascent.data import processors as P
from ascent.data.builders import processors_from_config, sft_examples_from_config
from ascent.data.validation import DataError
from ascent.transport.store_writer import Entry
from tests.unit.transport.test_store import single, write

ROWS = [{"prompt": f"q{i}", "answer": str(i), "rate": i / 4} for i in range(5)]
PLUGINS = """
def even(row, mod=2):
    return int(row["answer"]) % mod == 0

def hint(row, text):
    return {**row, "prompt": row["prompt"] + text}

def first(rows, n):
    return rows[:n]

def broken(rows):
    raise RuntimeError("boom")
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "row_plugins.py").write_text(PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))


def steps(*processors) -> list:
    return processors_from_config(DataConfig(train_path="x.jsonl", processors=list(processors)))


def test_the_processors_run_in_order(plugins, caplog):
    chain = steps(
        {"name": "filter", "fn": "row_plugins:even", "kwargs": {"mod": 2}},
        {"name": "transform", "fn": "row_plugins:hint", "kwargs": {"text": "!"}},
        {"name": "difficulty", "column": "rate", "low": 0.25, "high": 1.0},
        {"name": "row_plugins:first", "kwargs": {"n": 1}},
    )
    with caplog.at_level(logging.INFO, logger="ascent"):
        out = P.run_steps(list(ROWS), chain, "data.train_path=x")
    assert out == [{"prompt": "q2!", "answer": "2", "rate": 0.5}]  # 0, 2, 4 even; 0 too easy; first of 2, 4
    assert "data.processors[0] (filter) kept 3 of 5 rows" in caplog.text
    assert "data.processors[2] (difficulty) kept 2 of 3 rows" in caplog.text
    assert ROWS[2]["prompt"] == "q2"  # the rows loaded are not edited


def test_errors_name_the_processor(plugins):
    with pytest.raises(
        DataError, match=r"data.processors\[0\] \(row_plugins:broken\) failed: RuntimeError: boom"
    ):
        P.run_steps(list(ROWS), steps("row_plugins:broken"), "data.train_path=x")
    with pytest.raises(DataError, match=r"\(difficulty\) failed: KeyError: .row 1 has no column 'pass'"):
        P.run_steps(list(ROWS), steps({"name": "difficulty", "column": "pass"}), "data.train_path=x")
    with pytest.raises(DataError, match=r"\(row_plugins:first\) returned int, not a list of rows"):
        P.run_steps(list(ROWS), [("data.processors[0] (row_plugins:first)", len)], "data.train_path=x")


def test_a_processor_that_keeps_no_row_is_the_no_usable_prompts_error():
    chain = steps({"name": "difficulty", "column": "rate", "low": 0.9, "high": 0.95})
    with pytest.raises(
        DataError, match=r"no usable training prompts: data.processors\[0\] \(difficulty\) kept none"
    ):
        P.run_steps(list(ROWS), chain, "data.train_path=x")


def test_difficulty_from_an_earlier_runs_store(tmp_path):
    rewards = {0: [1.0, 1.0], 1: [1.0, 0.0], 2: [0.0, 0.0], 3: [0.5, 1.0]}  # row 4: never trained on
    entries = [
        Entry(single(row, r), 1, "trained", 0, group_index=row) for row, rs in rewards.items() for r in rs
    ]
    entries.append(Entry(single(2, 1.0), 1, "filtered", 0, reason="dynamic sampling"))  # not trained: ignored
    write(tmp_path / "experience.db", entries)
    chain = steps({"name": "difficulty", "store": str(tmp_path), "low": 0.2, "high": 0.8})
    assert [r["answer"] for r in P.run_steps(list(ROWS), chain, "x")] == ["1", "3"]
    with pytest.raises(DataError, match=r"data.processors\[0\].store='/nowhere': /nowhere/experience.db: no"):
        steps({"name": "difficulty", "store": "/nowhere"})


def test_config_refuses_unknown_names_and_a_difficulty_without_one_source():
    with pytest.raises(ValueError, match="must be one of filter, transform, difficulty or an import path"):
        RunConfig(data={"train_path": "x", "processors": ["dedupe"]})
    with pytest.raises(ValueError, match="set exactly one of column"):
        RunConfig(data={"train_path": "x", "processors": [{"name": "difficulty", "low": 0.1}]})


def test_sft_training_pairs_go_through_the_processors_and_validation_pairs_do_not(tmp_path, tokenizer):
    rows = [{"prompt": f"q{i}", "response": f"r{i}", "rate": i / 4} for i in range(4)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    processors = [{"name": "difficulty", "column": "rate", "low": 0.5}]
    cfg = SFTConfig(data={"train_path": str(path), "val_path": str(path), "processors": processors})
    train, _ = sft_examples_from_config(cfg, tokenizer, "train")
    val, _ = sft_examples_from_config(cfg, tokenizer, "val")
    assert (len(train), len(val)) == (2, 4)
