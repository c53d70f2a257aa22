"""SQL (read-only, bounded), BM25 search, functions as tools, the model's tool calls, and the built-in
python_math environment: each tool's happy path and failures come back as text for the model."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ascent.envs import ChatTokens, Task, make_env, run_episodes
from ascent.envs.agent import ToolEnv, last_number_matches
from ascent.envs.tools import SearchIndex, ToolResult, function_tool, parse_tool_calls, run_sql
from ascent.messages import Generation, GenerationRequest, SamplingParams


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (name TEXT, price INT)")
        conn.executemany("INSERT INTO items VALUES (?, ?)", [(f"item{i}", i) for i in range(100)])
    return path


def test_sql_reads_and_cannot_write(db: Path) -> None:
    r = run_sql(db, "SELECT name, price FROM items WHERE price < 2 ORDER BY price")
    assert r.ok and r.output == "name | price\nitem0 | 0\nitem1 | 1\n"
    for query in ("DROP TABLE items", "INSERT INTO items VALUES ('x', 1)", "UPDATE items SET price = 0"):
        r = run_sql(db, query)
        assert not r.ok and "readonly" in (r.error or "").replace("-", "")
    assert run_sql(db, "SELECT count(*) FROM items").output == "count(*)\n100\n"  # nothing was lost
    assert "no such table" in (run_sql(db, "SELECT * FROM nope").error or "")
    assert "more than 50 rows" in run_sql(db, "SELECT * FROM items").output
    assert (
        run_sql(db.with_name("missing.db"), "SELECT 1").error
        == f"database {str(db.with_name('missing.db'))!r} not found"
    )


def test_sql_stops_a_runaway_query(db: Path) -> None:
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    r = run_sql(db, endless, timeout_s=0.5)
    assert not r.ok and r.error == "query took too long (interrupted)"


def test_search_ranks_by_bm25(tmp_path: Path) -> None:
    docs = [
        ("Paris", "Paris is the capital of France."),
        ("Rome", "Rome is the capital of Italy."),
        ("Cats", "Cats sleep a lot. Cats purr."),
    ]
    index = SearchIndex.build(tmp_path / "idx.db", docs)
    assert index.search("capital of Italy", k=1).output == "[Rome] Rome is the capital of Italy.\n"
    assert index.search("cats purr", k=3).output.startswith("[Cats]")
    assert index.search("zebra").output == "no results\n"
    assert not index.search("?!").ok


def test_a_function_becomes_a_tool_and_bad_arguments_are_an_answer() -> None:
    def price(item: str, quantity: int = 1) -> dict[str, object]:
        """The price of `quantity` of an item.

        Details the model does not need."""
        if item == "boom":
            raise RuntimeError("out of stock")
        return {"item": item, "total": 3 * quantity}

    tool = function_tool(price)
    fn = tool.schema["function"]
    assert fn["name"] == "price" and fn["description"] == "The price of `quantity` of an item."
    assert (
        fn["parameters"]["required"] == ["item"]
        and fn["parameters"]["properties"]["quantity"]["default"] == 1
    )
    assert tool.call({"item": "tea", "quantity": 2}) == ToolResult(True, '{"item": "tea", "total": 6}')
    assert "quantity" in (tool.call({"item": "tea", "quantity": "many"}).error or "")
    assert tool.call({"item": "boom"}).error == "RuntimeError: out of stock"
    with pytest.raises(TypeError, match="cannot be described"):
        function_tool(lambda *a: a)


def test_tool_calls_are_parsed_and_bad_ones_reported() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> then '
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call><tool_call>{oops</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert len(errors) == 1 and "oops" in errors[0]
    assert parse_tool_calls("no calls here") == ([], [])


def test_tool_env_answers_calls_and_scores_the_final_answer() -> None:
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    env = ToolEnv([function_tool(double)], last_number_matches)
    assert env.reset({"prompt": "double 21", "answer": 42}) == [{"role": "user", "content": "double 21"}]
    step = env.step('<tool_call>{"name": "double", "arguments": {"x": 21}}</tool_call>')
    assert step.observation == ({"role": "tool", "content": "42"},) and not step.done
    assert step.info == {"tool_calls": 1}  # the runner sums these into the episode's metadata
    two = env.step(
        '<tool_call>{"name": "double", "arguments": {"x": 1}}</tool_call><tool_call>{"x"}</tool_call>'
    )
    assert two.info == {"tool_calls": 2} and "[error]" in two.observation[1]["content"]  # a malformed one too
    assert (
        "no tool 'triple'"
        in env.step('<tool_call>{"name": "triple", "arguments": {}}</tool_call>').observation[0]["content"]
    )
    assert env.step("It is 42.").reward == 1.0 and env.step("41").reward == 0.0


def test_python_math_through_the_runner(tmp_path: Path) -> None:
    """A scripted model calls the Python tool, reads its output as a tool message, and answers."""
    from ascent.models.tiny import DEFAULT_CHARS, make_char_tokenizer

    chat = ChatTokens(make_char_tokenizer(tmp_path / "tok", chars=DEFAULT_CHARS + "{}"))  # JSON needs braces
    turns = iter(['<tool_call>{"name": "python", "arguments": {"code": "print(12*34)"}}</tool_call>', "408"])

    def engine(requests: list[GenerationRequest]) -> list[list[Generation]]:
        ids = chat._encode(next(turns)) + [chat.tok.eos_token_id]
        return [[Generation(ids, [-0.1] * len(ids), "stop")] for _ in requests]

    (ep,) = run_episodes(
        [Task(make_env("python_math"), {"prompt": "12*34?", "answer": 408}, 0)],
        engine,
        chat,
        SamplingParams(max_new_tokens=200),
        max_turns=3,
        max_tokens=400,
    )
    assert ep.reward == 1.0 and ep.metadata["turns"] == 2 and ep.finish_reason == "stop"
    assert ep.metadata["tool_calls"] == 1
    observed = [t for t, m in zip(ep.response_ids, ep.loss_mask, strict=True) if m == 0]
    assert observed == chat.continuation_ids([{"role": "tool", "content": "408\n"}])
