"""The built-in tasks with generated data (text_to_sql, search_qa, guess_number): the generators are
deterministic per seed and their answers right (recomputed here without SQL), a scripted policy earns 1 and a
wrong answer 0 through the runner, tool errors are answers the episode goes on from, and rows in SkyRL-gym's
shape run as they are."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ascent.data import load_rows
from ascent.envs import ChatTokens, GuessNumber, Task, make_env, row_answer, row_env, run_episodes
from ascent.envs.agent import answer_matches, final_answer
from ascent.envs.rows import RowFieldError
from ascent.envs.tasks import make_guess_task, make_search_task, make_sql_task
from ascent.envs.tasks.common import main
from ascent.envs.tasks.search_task import SearchQa
from ascent.envs.tasks.sql_task import MONTHS, TextToSql
from ascent.envs.tools import SearchIndex
from ascent.messages import SamplingParams
from ascent.models.tiny import DEFAULT_CHARS, make_char_tokenizer
from tests.unit.envs.test_runner import ScriptedEngine

PARAMS = SamplingParams(max_new_tokens=400)


def load(path: Path) -> list[dict[str, Any]]:
    """The rows as training reads them: `db_path` / `index_path` made absolute under the rows' folder."""
    return load_rows(path)


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> ChatTokens:
    return ChatTokens(make_char_tokenizer(tmp_path_factory.mktemp("tok"), chars=DEFAULT_CHARS + "{}%|&"))


@pytest.fixture(scope="module")
def shops(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two shops (seeds 1 and 2), 60 training questions each."""
    return [make_sql_task(tmp_path_factory.mktemp(f"shop{s}"), 60, seed=s) for s in (1, 2)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_search_task(tmp_path_factory.mktemp("corpus"), 60, seed=1)


def run(chat: ChatTokens, rows: list[dict[str, Any]], scripts: list[list[str]], **kw: Any) -> list[Any]:
    tasks = [Task(make_env(str(row_env(r))), r, i) for i, r in enumerate(rows)]
    engine = ScriptedEngine(chat, dict(enumerate(scripts)))
    return run_episodes(tasks, engine, chat, PARAMS, max_turns=4, max_tokens=3000, **kw)


# --- text-to-SQL -------------------------------------------------------------------------------------------


def tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(db) as conn:
        out = {
            t: conn.execute(f"SELECT * FROM {t} ORDER BY id").fetchall()
            for t in ("customers", "products", "orders")
        }
    conn.close()
    return out


def test_the_sql_task_is_deterministic_per_seed(tmp_path: Path, shops: list[Path]) -> None:
    again = make_sql_task(tmp_path / "again", 60, seed=1)
    first, second = load(shops[0]), load(again)
    assert [{**r, "db_path": ""} for r in first] == [{**r, "db_path": ""} for r in second]
    assert tables(shops[0].with_name("shop.db")) == tables(again.with_name("shop.db"))
    assert (
        load(shops[0].with_name("val.jsonl"))[0]["prompt"] == load(again.with_name("val.jsonl"))[0]["prompt"]
    )
    assert tables(shops[0].with_name("shop.db")) != tables(shops[1].with_name("shop.db"))
    assert len(first) == 60 and len(load(shops[0].with_name("val.jsonl"))) == 6
    assert {r["prompt"] for r in first}.isdisjoint(r["prompt"] for r in load(shops[0].with_name("val.jsonl")))
    assert {r["level"] for r in first} == {1, 2, 3} and len({r["template"] for r in first}) >= 8
    assert all(r["env"] == "text_to_sql" and Path(r["db_path"]).is_file() for r in first)


def python_answer(t: dict[str, list[tuple[Any, ...]]], row: dict[str, Any]) -> Any:
    """The answer of a question computed in Python over the tables (no SQL), for the templates checked."""
    customers = {c[0]: c for c in t["customers"]}  # id, name, city, joined
    products = {p[0]: p for p in t["products"]}  # id, name, category, price
    orders = t["orders"]  # id, customer_id, product_id, quantity, order_date, status
    p = row["params"]
    month = lambda o: o[4][5:7] == f"{MONTHS.index(p['month']) + 1:02d}"  # noqa: E731
    paid = lambda o: o[5] != "cancelled"  # noqa: E731
    by = {
        "customers_in_city": lambda: sum(c[2] == p.get("city") for c in customers.values()),
        "orders_of_customer": lambda: sum(customers[o[1]][1] == p["customer"] for o in orders),
        "units_of_product": lambda: sum(o[3] for o in orders if products[o[2]][1] == p["product"]),
        "spent_by_customer": lambda: round(
            sum(o[3] * products[o[2]][3] for o in orders if customers[o[1]][1] == p["customer"] and paid(o)),
            2,
        ),
        "revenue_in_month": lambda: round(
            sum(o[3] * products[o[2]][3] for o in orders if month(o) and paid(o)), 2
        ),
        "cancelled_in_month": lambda: sum(month(o) and not paid(o) for o in orders),
    }
    if row["template"] == "top_customer_in_category":
        units: Counter[str] = Counter()
        for o in orders:
            if products[o[2]][2] == p["category"]:
                units[customers[o[1]][1]] += o[3]
        (best, n), (_, runner_up) = units.most_common(2)
        assert n > runner_up  # the generator leaves ties out
        return best
    return by[row["template"]]() if row["template"] in by else None


def test_sql_answers_are_right(shops: list[Path]) -> None:
    checked: Counter[str] = Counter()
    for rows in shops:
        t = tables(rows.with_name("shop.db"))
        for row in load(rows) + load(rows.with_name("val.jsonl")):
            expected = python_answer(t, row)
            if expected is not None:
                assert expected == pytest.approx(row["answer"]), row
                checked[row["template"]] += 1
    assert len(checked) == 7 and sum(checked.values()) >= 30


def sql_policy(row: dict[str, Any], answer: Any = None) -> list[str]:
    """Run the reference query, then answer (the right answer unless told another)."""
    return [call("sql", query=row["sql"]), f"<answer>{row['answer'] if answer is None else answer}</answer>"]


def test_text_to_sql_rewards_the_right_answer_over_two_databases(chat: ChatTokens, shops: list[Path]) -> None:
    rows = [load(shops[0])[0], load(shops[1])[0], load(shops[0])[1], load(shops[1])[1]]
    scripts = [
        sql_policy(rows[0]),
        sql_policy(rows[1]),
        sql_policy(rows[2], "Nobody"),
        sql_policy(rows[3], -1),
    ]
    episodes = run(chat, rows, scripts)
    assert [e.reward for e in episodes] == [1.0, 1.0, 0.0, 0.0]
    assert all(e.metadata["turns"] == 2 and e.finish_reason == "stop" for e in episodes)
    observed = chat.decode(
        [t for t, m in zip(episodes[0].response_ids, episodes[0].loss_mask, strict=True) if not m]
    )
    assert str(rows[0]["answer"]) in observed  # the tool's rows came back as the observation


def test_a_bad_query_is_an_answer_and_writes_are_refused(shops: list[Path]) -> None:
    row = load(shops[0])[0]
    env = TextToSql()
    system, user = env.reset(row)
    assert "CREATE TABLE orders" in system["content"] and user == {"role": "user", "content": row["prompt"]}
    bad = env.step(call("sql", query="SELECT nme FROM customerz"))
    assert (
        not bad.done
        and "[error]" in bad.observation[0]["content"]
        and "no such table" in bad.observation[0]["content"]
    )
    for write in ("DROP TABLE orders", "DELETE FROM customers", "UPDATE products SET price = 0"):
        refused = env.step(call("sql", query=write)).observation[0]["content"]
        assert "readonly" in refused.replace("-", "")
    assert env.step(call("sql")).observation[0]["content"].startswith("[error] bad arguments for sql")
    assert env.step(f"<answer>{row['answer']}</answer>").reward == 1.0  # the episode went on
    assert tables(Path(row["db_path"]))["orders"]  # nothing was lost
    with pytest.raises(FileNotFoundError, match="sql_task"):
        TextToSql().reset({**row, "db_path": str(shops[0].with_name("nope.db"))})


# --- search QA ---------------------------------------------------------------------------------------------


def test_the_search_task_is_deterministic_and_its_answers_are_in_the_documents(
    tmp_path: Path, corpus: Path
) -> None:
    again = make_search_task(tmp_path / "again", 60, seed=1)
    assert [{**r, "index_path": ""} for r in load(corpus)] == [{**r, "index_path": ""} for r in load(again)]
    assert corpus.with_name("corpus.jsonl").read_text() == again.with_name("corpus.jsonl").read_text()
    assert make_search_task(tmp_path / "other", 60, seed=2).with_name("corpus.jsonl").read_text() != (
        again.with_name("corpus.jsonl").read_text()
    )
    docs = {d["title"]: d["text"] for d in load(corpus.with_name("corpus.jsonl"))}
    rows = load(corpus) + load(corpus.with_name("val.jsonl"))
    assert {r["hops"] for r in rows} == {1, 2}
    for r in rows:
        first, last = r["docs"][0], r["docs"][-1]
        assert first in r["prompt"]  # the question names the first document's entity ...
        if r["hops"] == 2:
            assert last in docs[first] and last not in r["prompt"]  # ... which names the second's
        number = f"{r['answer']:,}" if isinstance(r["answer"], int) else r["answer"]
        assert str(number) in docs[last] or str(r["answer"]) in docs[last]


def test_search_finds_the_entity_first(corpus: Path) -> None:
    index = SearchIndex(corpus.with_name("index.db"))
    titles = [d["title"] for d in load(corpus.with_name("corpus.jsonl"))]
    assert len(titles) == len(set(titles)) > 100
    for title in titles:
        assert index.search(title, k=3).output.startswith(f"[{title}] "), title


def search_policy(row: dict[str, Any], answer: Any = None) -> list[str]:
    """Search each needed document by its title, then answer."""
    return [call("search", query=t) for t in row["docs"]] + [
        f"<answer>{row['answer'] if answer is None else answer}</answer>"
    ]


def test_search_qa_rewards_the_right_answer(chat: ChatTokens, corpus: Path) -> None:
    rows = load(corpus)
    one = next(r for r in rows if r["hops"] == 1)
    two = next(r for r in rows if r["hops"] == 2)
    episodes = run(
        chat, [one, two, two], [search_policy(one), search_policy(two), search_policy(two, "Atlantis")]
    )
    assert [e.reward for e in episodes] == [1.0, 1.0, 0.0]
    assert [e.metadata["turns"] for e in episodes] == [2, 3, 3]
    env = SearchQa()
    env.reset(two)
    seen = env.step(call("search", query=two["docs"][0])).observation[0]["content"]
    assert seen.startswith(f"[{two['docs'][0]}]") and two["docs"][1] in seen
    assert "[error]" in env.step(call("search", query="?!")).observation[0]["content"]


# --- guess_number ------------------------------------------------------------------------------------------


def bisect(row: dict[str, Any], env: GuessNumber) -> tuple[float, int]:
    """Play `row` by halving the range on each hint -> (reward, guesses)."""
    low, high = row["low"], row["high"]
    env.reset(row)
    while True:
        guess = (low + high) // 2
        step = env.step(f"I guess {guess}.")
        if step.done:
            return step.reward, step.info["guesses"]
        low, high = (guess + 1, high) if step.observation[0]["content"] == "higher" else (low, guess - 1)


def test_guess_number_is_a_game_over_the_rows_range(tmp_path: Path) -> None:
    rows = load(make_guess_task(tmp_path, 40, seed=0))
    assert rows == load(make_guess_task(tmp_path / "again", 40, seed=0))
    assert len({(r["low"], r["high"]) for r in rows}) > 3
    for row in rows:
        env = GuessNumber()
        assert env.reset(row) == [{"role": "user", "content": row["prompt"]}]
        reward, guesses = bisect(row, env)
        assert reward == 1.0 and guesses <= row["max_guesses"]
    row = {"answer": 70, "low": 1, "high": 100, "max_guesses": 2}
    env = GuessNumber()
    assert env.reset(row)[0]["content"] == "Guess my number from 1 to 100 in 2 tries."
    assert env.step("a guess").observation[0]["content"] == "not a number"  # not counted as a guess
    assert env.step("50").observation[0]["content"] == "higher"
    last = env.step("99")
    assert last.done and last.reward == 0.0 and last.info == {"guesses": 2}  # out of guesses
    assert GuessNumber().reset({"target": 3}) == [{"role": "user", "content": "Guess my number from 0 to 9."}]
    with pytest.raises(ValueError, match="outside"):
        GuessNumber().reset({"target": 30})
    with pytest.raises(RowFieldError, match="no `target`"):
        GuessNumber().reset({"goal": 3})


# --- rows in SkyRL-gym's shape -----------------------------------------------------------------------------


def test_skyrl_shaped_rows_run_as_they_are(chat: ChatTokens, tmp_path: Path) -> None:
    sql = load(make_sql_task(tmp_path / "sql", 10, seed=3, shape="skyrl"))[0]
    search = load(make_search_task(tmp_path / "search", 10, seed=3, shape="skyrl"))[0]
    guess = load(make_guess_task(tmp_path / "guess", 10, seed=3, shape="skyrl"))[0]
    assert set(sql) == {"prompt", "env_class", "reward_spec", "extra_info"} and "env" not in sql
    assert sql["prompt"][0]["role"] == "user" and sql["reward_spec"]["method"] == "rule"
    flat = {"sql": sql["extra_info"]["sql"], "answer": sql["reward_spec"]["ground_truth"]}
    found = {"docs": search["extra_info"]["docs"], "answer": row_answer(search)}
    target = guess["reward_spec"]["ground_truth"]
    episodes = run(chat, [sql, search, guess], [sql_policy(flat), search_policy(found), [str(target)]])
    assert [e.reward for e in episodes] == [1.0, 1.0, 1.0]
    assert [row_env(r) for r in (sql, search, guess)] == ["text_to_sql", "search_qa", "guess_number"]


def test_skyrl_rows_in_environment_processes(chat: ChatTokens, shops: list[Path], corpus: Path) -> None:
    """The registered tasks are made by name in host processes (imported lazily there)."""
    from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
    from ascent.envs.tasks.common import to_skyrl

    rows = [to_skyrl(load(shops[0])[2]), to_skyrl(load(corpus)[2])]
    flat = [{**r["extra_info"], "answer": row_answer(r)} for r in rows]
    tasks = [Task(str(row_env(r)), r, i) for i, r in enumerate(rows)]
    engine = ScriptedEngine(chat, {0: sql_policy(flat[0]), 1: search_policy(flat[1])})
    hosts = ProcessHosts(1, IsolationPolicy("environment", 30, "rollout.env_timeout_s"))
    try:
        episodes = run_episodes(tasks, engine, chat, PARAMS, max_turns=4, max_tokens=3000, hosts=hosts)
    finally:
        hosts.close()
    assert [e.reward for e in episodes] == [1.0, 1.0] and "env_error" not in episodes[0].metadata


def test_answers_are_matched_as_numbers_or_normalised_text() -> None:
    assert final_answer("I think <answer> 42 </answer>") == "42" and final_answer(" Lisbon ") == "Lisbon"
    assert answer_matches("<answer>1,537.11</answer>", {"answer": 1537.11}) == 1.0
    assert answer_matches("It is 1537.1100000001", {"answer": "1537.11"}) == 1.0
    assert answer_matches("<answer>1537.1</answer>", {"answer": 1537.11}) == 0.0
    assert answer_matches("<answer>The  Copper kettle.</answer>", {"answer": "Copper Kettle"}) == 1.0
    assert answer_matches("<answer>Kettle</answer>", {"answer": "Copper Kettle"}) == 0.0
    skyrl = {"reward_spec": {"method": "rule", "ground_truth": {"target": ["Oslo", "Christiania"]}}}
    assert answer_matches("<answer>christiania</answer>", skyrl) == 1.0
    assert answer_matches("Paris", skyrl) == 0.0
    assert row_answer({"answer": 0, "reward_spec": {"ground_truth": 1}}) == 0  # `answer` wins
    with pytest.raises(KeyError, match="reward_spec.ground_truth"):
        row_answer({"prompt": "?"})
    assert (
        row_env({"env_class": "search_qa"}) == "search_qa" and row_env({"env": "a", "env_class": "b"}) == "a"
    )
    assert row_env({}) is None


def test_the_command_line_writes_the_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(make_sql_task, "", [str(tmp_path / "cli"), "--rows", "12", "--val", "3", "--seed", "4"])
    assert "12 + 3 rows" in capsys.readouterr().out
    cli = load(tmp_path / "cli" / "rows.jsonl")
    api = load(make_sql_task(tmp_path / "api", 12, seed=4, n_val=3))
    assert len(cli) == 12 and len(load(tmp_path / "cli" / "val.jsonl")) == 3
    assert [{**r, "db_path": ""} for r in cli] == [{**r, "db_path": ""} for r in api]
    with pytest.raises(ValueError, match="different questions"):
        make_sql_task(tmp_path / "big", 5000)


def test_rows_name_their_files_relative_to_themselves_so_the_folder_can_move(
    tmp_path: Path, chat: ChatTokens
) -> None:
    """The generators write `db_path` / `index_path` relative to the rows file; after the data folder moves,
    the rows (read with `load_rows`) still find the database, and an episode runs on it."""
    import shutil

    rows = make_sql_task(tmp_path / "made", 4, seed=1)
    index = make_search_task(tmp_path / "search", 4, seed=1)
    assert {json.loads(line)["db_path"] for line in rows.read_text().splitlines()} == {"shop.db"}
    assert {json.loads(line)["index_path"] for line in index.read_text().splitlines()} == {"index.db"}
    moved = Path(shutil.move(tmp_path / "made", tmp_path / "moved")) / "rows.jsonl"
    row = load(moved)[0]
    assert row["db_path"] == str((tmp_path / "moved" / "shop.db").resolve())
    (episode,) = run(chat, [row], [[f"<answer>{row['answer']}</answer>"]])
    assert episode.reward == 1.0


def test_the_generators_run_as_modules_without_a_runpy_warning(tmp_path: Path) -> None:
    """`python -m ascent.envs.tasks.guess_task`: the package does not import its generators up front (runpy
    warns when the module it is about to run is already in sys.modules)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-W", "error::RuntimeWarning", "-m", "ascent.envs.tasks.guess_task"]
    proc = subprocess.run(
        [*cmd, str(tmp_path / "g"), "--rows", "4"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert (tmp_path / "g" / "rows.jsonl").is_file()
