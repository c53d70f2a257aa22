"""`ascent train` records every episode in run_dir/experience.db, exactly the episodes the trainer used (the
same as episodes.jsonl), a resumed run keeps each iteration once, and `ascent episodes` lists, shows and
exports them."""

from __future__ import annotations

import json

from conftest import ascent_here, run_config, write_yaml

from ascent.tracking.experience_store import open_store


def jsonl_episodes(run_dir) -> list[tuple]:
    lines = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    return [(x["iteration"], x["group"], x["row_id"], x["reward"], x["response_len"]) for x in lines]


def stored_episodes(run_dir) -> list[tuple]:
    with open_store(run_dir) as store:
        assert {r.status for r in store.iter_episodes()} == {"trained"}
        return [
            (r.iteration, r.group_index, r.row_id, r.reward, r.response_len) for r in store.iter_episodes()
        ]


def test_store_holds_the_trained_episodes_and_the_cli_reads_it(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=2, val_every=0)
    cfg["checkpoint"] = {"every": 1}
    yaml_path = write_yaml(tmp_path / "run.yaml", cfg)
    ascent_here("train", str(yaml_path))
    run_dir = tmp_path / "run"
    first = stored_episodes(run_dir)
    assert len(first) == 2 * 2 * 4  # iterations x prompts_per_step x samples_per_prompt
    assert first == jsonl_episodes(run_dir)
    with open_store(run_dir) as store:
        ep = store.episode(1)
        assert ep.prompt_text and ep.segments and len(ep.sampler_logprobs) == ep.response_len

    ascent_here("train", str(yaml_path), "--resume-from", "iter_000001")  # iteration 2 again, recorded once
    again = stored_episodes(run_dir)
    assert [x[0] for x in again] == [1] * 8 + [2] * 8
    assert again == jsonl_episodes(run_dir) and again[:8] == first[:8]

    listing = ascent_here("episodes", str(run_dir), "--iteration", "2", "--status", "trained", "--limit", "3")
    assert "3 of 8 episodes" in listing.stdout
    shown = ascent_here("episodes", str(run_dir), "--show", "1").stdout
    assert "episode 1: iteration 1, group 0" in shown and "model turn 1" in shown and "prompt (" in shown
    out = tmp_path / "x.jsonl"
    assert (
        f"16 episodes written to {out}" in ascent_here("episodes", str(run_dir), "--export", str(out)).stdout
    )
    exported = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["iteration"], x["row_id"], x["reward"]) for x in exported] == [
        (i, r, w) for i, _, r, w, _ in again
    ]

    missing = ascent_here("episodes", str(tmp_path / "nowhere"), check=False)
    assert missing.returncode == 2 and str(tmp_path / "nowhere" / "experience.db") in missing.stderr
