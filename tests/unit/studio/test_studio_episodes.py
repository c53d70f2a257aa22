"""The episode list as the server pages it: newest first, `offset`/`limit` pages with no cap on how far back,
a text search in prompt and response (literal, case-insensitive), a prompt column, and a run without an
experience store (an SFT run) answering an empty list that says why instead of an error."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ascent.studio import create_app
from ascent.studio.episodes import PROMPT_PREVIEW_CHARS, list_episodes, prompt_preview
from ascent.tracking.experience_store import STATUSES
from ascent.transport.store_writer import Entry, ExperienceWriter, prepare_store

from .conftest import WORDS, make_run, multi_turn


def seven_episodes(run_dir: Path) -> Path:
    """Episodes 1..7 for rows 0..6: even rows ask `what is 4 ?`, odd rows `what is 2+2 ?`; row r answers
    `answer r` (row 5 answers `100% sure`)."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("")
    path = run_dir / "experience.db"
    prepare_store(path, 0, meta={"tokenizer": ""})
    writer = ExperienceWriter(path, decode=lambda ids: " ".join(WORDS[i] for i in ids))
    entries = []
    for row in range(7):
        ep = multi_turn(row, reward=row / 10)
        prompt = [1, 2, 8, 4] if row % 2 == 0 else [1, 2, 3, 4]
        text = "100% sure" if row == 5 else f"answer {row}"
        entries.append(Entry(replace(ep, prompt_ids=prompt, response_text=text), 1 + row // 4, "trained", 1))
    writer.put(entries)
    writer.close()
    assert writer.error is None
    return run_dir


def rows(listing: dict) -> list[int]:
    return [e["row_id"] for e in listing["episodes"]]


def test_pages_come_newest_first_with_no_cap(tmp_path: Path) -> None:
    run = seven_episodes(tmp_path / "run")
    pages = [list_episodes(run, {}, offset, 3) for offset in (0, 3, 6)]
    assert [rows(p) for p in pages] == [[6, 5, 4], [3, 2, 1], [0]]
    assert all(p["matching"] == p["total"] == 7 and p["limit"] == 3 for p in pages)
    assert [p["offset"] for p in pages] == [0, 3, 6]
    assert rows(list_episodes(run, {}, 7, 3)) == []
    assert list_episodes(run, {}, -5, 0)["offset"] == 0 and list_episodes(run, {}, 0, 0)["limit"] == 1


def test_search_matches_prompt_or_response_text_literally(tmp_path: Path) -> None:
    run = seven_episodes(tmp_path / "run")
    assert rows(list_episodes(run, {"search": "ANSWER 3"})) == [3]
    assert rows(list_episodes(run, {"search": "what is 4"})) == [6, 4, 2, 0]  # in the prompt
    assert rows(list_episodes(run, {"search": "100%"})) == [5]  # % is a character, not a wildcard
    assert rows(list_episodes(run, {"search": "0%"})) == [5]
    assert rows(list_episodes(run, {"search": "answer_"})) == []
    both = list_episodes(run, {"search": "what is 4", "iteration": 2}, 0, 1)
    assert rows(both) == [6] and both["matching"] == 2 and both["total"] == 7


def test_each_row_shows_its_prompt_shortened(tmp_path: Path) -> None:
    run = seven_episodes(tmp_path / "run")
    first = list_episodes(run, {})["episodes"][0]
    assert first["prompt"] == "what is 4 ?" and first["preview"] == "answer 6"
    chat = (
        "<|im_start|>system\nBe brief."
        + " Really." * 30
        + "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    )
    shown = prompt_preview(chat)
    assert (
        len(shown) == PROMPT_PREVIEW_CHARS and shown.startswith("…") and shown.endswith("user ⏎ What is 2+2?")
    )
    assert "<|" not in shown


def test_the_api_pages_and_searches(tmp_path: Path) -> None:
    seven_episodes(tmp_path / "runs" / "rl")
    client = TestClient(create_app(tmp_path / "runs"), base_url="http://127.0.0.1:8765")
    got = client.get(
        "/api/episodes", params={"run": "rl", "offset": 2, "limit": 2, "search": "answer"}
    ).json()
    assert (
        rows(got) == [3, 2] and got["matching"] == 6
    )  # rows 6, 4 | 3, 2 | 1, 0 (5 is "100% sure") and got["missing"] is None


@pytest.mark.parametrize("kind", ["sft", "train"])
def test_a_run_without_a_store_lists_none_and_says_why(tmp_path: Path, kind: str) -> None:
    run = make_run(tmp_path / "runs" / "run", episodes=False)
    (run / "status.json").write_text(f'{{"state": "finished", "kind": "{kind}"}}')
    client = TestClient(create_app(tmp_path / "runs"), base_url="http://127.0.0.1:8765")
    got = client.get("/api/episodes", params={"run": "run"})
    assert got.status_code == 200 and got.json()["episodes"] == []
    why = got.json()["missing"]
    assert ("SFT runs record no episodes" in why) == (kind == "sft")
    assert client.get("/api/run", params={"run": "run"}).json()["has_episodes"] is False


def test_every_status_the_store_writes_is_a_filter(tmp_path: Path) -> None:
    """The studio filters with the store's own reader (no copy of its statuses to fall behind): `served`
    (what `ascent serve --record` writes) and `dropped` are filters like the loop's statuses."""
    run = seven_episodes(tmp_path / "run")
    assert "served" in STATUSES
    for status in STATUSES:
        assert list_episodes(run, {"status": status})["matching"] == (7 if status == "trained" else 0)
    assert list_episodes(run, {"status": "dropped"})["matching"] == 0
