"""`ascent train` with `rollout.env`: multi-turn episodes collected through an environment, rewarded by it,
trained on (observation tokens masked out), validated the same way; unsupported combinations are refused
with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import ascent, run_config, write_yaml


def rows(path: Path, targets: list[int]) -> Path:
    path.write_text("".join(json.dumps({"target": t}) + "\n" for t in targets))
    return path


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_train_on_a_multi_turn_environment(tmp_path: Path, tiny_model: Path, engine: str) -> None:
    """On the fast engine each later turn reuses the episode's cached history (rollout/prefix_reused_tokens)."""
    data = tmp_path / "data"
    data.mkdir()
    rows(data / "train.jsonl", [3, 7, 1, 9, 5, 0])
    rows(data / "val.jsonl", [4, 6])
    stop_tokens = list(range(4, 40))  # every ordinary character ends a turn: one-token guesses, several turns
    cfg = run_config(tmp_path, tiny_model, data, iterations=2, val_every=1)
    cfg["rollout"] |= {
        "env": "guess_number",
        "max_turns": 3,
        "max_episode_tokens": 48,
        "stop_token_ids": stop_tokens,
        "engine": engine,
    }
    cfg["data"]["max_prompt_tokens"] = 40
    cfg["train"]["max_tokens_per_micro_batch"] = 88  # prompt 40 + episode 48
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "env/turns_mean" in m]
    assert len(trained) == 2 and all(1.0 <= m["env/turns_mean"] <= 3.0 for m in trained)
    assert max(m["env/turns_mean"] for m in trained) > 1.0  # episodes went past their first turn
    assert all(m["env/errors"] == 0.0 and "val/accuracy" in m for m in trained)
    assert all(m["train/optimizer_steps"] >= 1 and m["rollout/response_len_max"] <= 48 for m in trained)
    reused = [m["rollout/prefix_reused_tokens"] for m in trained]
    assert all(0 <= r < m["rollout/prompt_tokens"] for r, m in zip(reused, trained, strict=True))
    assert (sum(reused) > 0) == (engine == "fast")
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 2 * 4 and {e["finish"] for e in episodes} <= {"stop", "length"}


def test_unsupported_combinations_name_the_field(tmp_path: Path, tiny_model: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rows(data / "train.jsonl", [3])
    cfg = run_config(tmp_path, tiny_model, data, iterations=1)
    cfg["data"].pop("val_path")
    cfg["rollout"] |= {"env": "guess_number", "max_episode_tokens": 16}
    cfg["algorithm"] = {"advantage": "remax"}
    proc = ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)), check=False)
    assert proc.returncode == 2 and "algorithm.advantage='remax'" in proc.stderr
    cfg.pop("algorithm")
    cfg["rollout"] |= {"env": "no_such_env"}
    proc = ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)), check=False)
    assert (
        proc.returncode == 2
        and "'no_such_env' is not registered" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_a_hanging_environment_costs_its_episodes_not_the_run(tmp_path: Path, tiny_model: Path) -> None:
    """rollout.env_isolation=process (the default): one row's environment hangs at its first step; it is killed
    after env_timeout_s, its episodes (and those sharing its process) count as env/errors, the run finishes."""
    data = tmp_path / "data"
    data.mkdir()
    counter, hang = "tests.unit.envs.hostile:Counter", "tests.unit.envs.hostile:Hang"
    lines = [{"env": hang if i == 0 else counter, "turns": 2} for i in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = run_config(tmp_path, tiny_model, data, iterations=1)
    cfg["data"].pop("val_path")
    cfg["data"]["shuffle"] = False
    cfg["rollout"] |= {"env": counter, "max_turns": 3, "max_episode_tokens": 24, "env_timeout_s": 3.0,
                       "env_workers": 2, "stop_token_ids": list(range(4, 40))}  # fmt: skip
    cfg["reward"] = {"max_failure_rate": 0.9}
    cfg["train"]["max_tokens_per_micro_batch"] = 64
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    (metrics,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 1.0 <= metrics["env/errors"] < 8.0  # the hung row's episodes and its process-mates, not all
    assert (
        metrics["reward/mean"] > 0.0
    )  # the Counter episodes on the other process finished and were rewarded
