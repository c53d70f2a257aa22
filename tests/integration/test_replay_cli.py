"""`ascent train` with replay and data processors: a first run writes its experience store; a second keeps
the rows that run saw (a difficulty processor reading its store) and trains on half its groups replayed from
it, which its metrics count and its own store marks."""

from __future__ import annotations

import json

from conftest import ascent_here, run_config, write_yaml

from ascent.tracking.experience_store import open_store


def cheap_run(tmp_path, tiny_model, arithmetic_data, iterations: int) -> dict:
    """A run without validation, TensorBoard or trace, one optimizer step per iteration (no separate
    old-logprob pass): what these runs assert costs no more than that."""
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=iterations, val_every=0)
    cfg["data"].pop("val_path")
    cfg["train"]["trajectories_per_update"] = 8
    cfg["tracking"] |= {"tensorboard": False, "trace": False}
    return cfg


def test_a_second_run_replays_the_first_runs_groups(tmp_path, tiny_model, arithmetic_data):
    first = cheap_run(tmp_path, tiny_model, arithmetic_data, iterations=1)
    ascent_here("train", str(write_yaml(tmp_path / "first.yaml", first)))
    first_dir = tmp_path / "run"

    second = cheap_run(tmp_path, tiny_model, arithmetic_data, iterations=2)
    second["run_dir"] = str(tmp_path / "second")
    second["data"]["processors"] = [{"name": "difficulty", "store": str(first_dir), "low": 0.0, "high": 1.0}]
    second["replay"] = {"store": str(first_dir), "ratio": 0.5, "score": "uniform"}
    second["algorithm"] = {"rollout_correction": "tis"}
    out = ascent_here("train", str(write_yaml(tmp_path / "second.yaml", second)))
    assert "data.processors[0] (difficulty) kept 2 of" in out.stderr + out.stdout  # the rows run 1 trained on

    metrics = [json.loads(x) for x in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if m["step"] >= 1]
    assert [m["replay/groups"] for m in trained] == [1.0, 1.0]
    with open_store(first_dir) as store:
        stored_rewards = {r.id: r.reward for r in store.iter_episodes()}
        stored = {r.id: (r.sampler_logprobs, r.token_versions) for r in store.iter_episodes()}
    with open_store(tmp_path / "second") as store:
        episodes = store.episodes(status="trained")
    replayed = [r for r in episodes if "replayed_from" in r.metadata]
    assert len(episodes) == 2 * 2 * 4 and len(replayed) == 2 * 4  # one group of four per iteration
    for it in (1, 2):
        rows = [r for r in replayed if r.iteration == it]
        mean = sum(r.reward for r in rows) / len(rows)
        assert abs(mean - next(m for m in trained if m["step"] == it)["replay/mean_reward"]) < 1e-9
    for r in replayed:  # the stored episode, as sampled: its reward, logprobs and versions
        origin = r.metadata["replayed_from"]["episode"]
        assert r.reward == stored_rewards[origin]
        assert (r.sampler_logprobs, r.token_versions) == stored[origin]
