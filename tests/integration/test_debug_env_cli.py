"""`ascent debug env` through the real CLI: episodes printed turn by turn and written with ids and masks; a
dataset without an environment is a clear error with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import ascent_here


def test_debug_env_prints_and_writes_episodes(tmp_path: Path, tiny_model: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"target": t}) + "\n" for t in (3, 7, 1)))
    out = tmp_path / "episodes.jsonl"
    proc = ascent_here(
        "debug",
        "env",
        "--model",
        str(tiny_model),
        "--data",
        str(rows),
        "--env",
        "guess_number",
        "--episodes",
        "2",
        "--max-turns",
        "3",
        "--max-new-tokens",
        "3",
        "--out",
        str(out),
    )
    assert proc.stdout.count("=== row") == 2 and "[model 1]" in proc.stdout and "[prompt]" in proc.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["row_id"] for r in lines] == [0, 1]
    for r in lines:
        assert len(r["response_ids"]) == len(r["loss_mask"]) == len(r["sampler_logprobs"]) > 0
        assert r["segments"][0]["mask"] == 1 and r["finish"] in ("stop", "length", "abort")


def test_debug_env_without_an_env_names_the_fix(tmp_path: Path, tiny_model: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"target": 3}) + "\n")
    proc = ascent_here("debug", "env", "--model", str(tiny_model), "--data", str(rows), check=False)
    assert proc.returncode == 2 and "--env is not set" in proc.stderr and "Traceback" not in proc.stderr
    # the same rows with --env run: test_debug_env_prints_and_writes_episodes (guess_number, `target` rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"goal": 3}) + "\n")
    proc = ascent_here(
        "debug", "env", "--model", str(tiny_model), "--data", str(bad), "--env", "guess_number", check=False
    )
    assert (
        proc.returncode == 2 and "row 1: GuessNumber.reset failed" in proc.stderr and "'goal'" in proc.stderr
    )
