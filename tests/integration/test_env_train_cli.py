"""`ascent train` with an env `rollout.source`: multi-turn episodes collected through an environment,
rewarded by it, trained on (observation tokens masked out), validated the same way; unsupported combinations
are refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import ascent, ascent_here, run_config, write_yaml


def rows(path: Path, targets: list[int]) -> Path:
    path.write_text("".join(json.dumps({"target": t}) + "\n" for t in targets))
    return path


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_train_on_a_multi_turn_environment(tmp_path: Path, tiny_model: Path, engine: str) -> None:
    """On the fast engine each later turn reuses the episode's cached history
    (rollout/prefix_reused_tokens)."""
    data = tmp_path / "data"
    data.mkdir()
    rows(data / "train.jsonl", [3, 7, 1, 9, 5, 0])
    rows(data / "val.jsonl", [4, 6])
    stop_tokens = list(range(4, 40))  # every ordinary character ends a turn: one-token guesses, several turns
    cfg = run_config(tmp_path, tiny_model, data, iterations=2, val_every=1)
    cfg["rollout"] |= {
        "source": {"name": "env", "env": "guess_number", "max_turns": 3, "max_episode_tokens": 48},
        "stop_token_ids": stop_tokens,
        "engine": engine,
    }
    cfg["data"]["max_prompt_tokens"] = 40
    cfg["train"]["max_tokens_per_micro_batch"] = 88  # prompt 40 + episode 48
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "env/turns_mean" in m]
    assert len(trained) == 2 and all(1.0 <= m["env/turns_mean"] <= 3.0 for m in trained)
    assert max(m["env/turns_mean"] for m in trained) > 1.0  # episodes went past their first turn
    assert all(m["env/errors"] == 0.0 and "val/accuracy" in m for m in trained)
    assert all(m["train/optimizer_steps"] + m["train/skipped_steps"] == 2 for m in trained)
    assert all(m["rollout/response_len_max"] <= 48 for m in trained)
    # fp32 on the CPU: sampler and trainer agree on every SAMPLED token (the tool tokens, loss mask 0, have no
    # sampler logprob and are not counted: counted, they read as nats of mismatch)
    assert all(m["rollout/logprob_diff_max"] < 1e-3 for m in trained)
    assert not (tmp_path / "run" / "logprob_outliers.jsonl").exists()
    reused = [m["rollout/prefix_reused_tokens"] for m in trained]
    assert all(0 <= r < m["rollout/prompt_tokens"] for r, m in zip(reused, trained, strict=True))
    assert (sum(reused) > 0) == (engine == "fast")
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 2 * 4 and {e["finish"] for e in episodes} <= {"stop", "length"}


def test_unsupported_combinations_name_the_field(tmp_path: Path, tiny_model: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rows(data / "train.jsonl", [3])
    cfg = run_config(tmp_path, tiny_model, data, iterations=1, val_every=0)
    cfg["data"].pop("val_path")
    cfg["rollout"] |= {"source": {"name": "env", "env": "guess_number", "max_episode_tokens": 16}}
    cfg["algorithm"] = {"advantage": "remax"}
    proc = ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)), check=False)
    assert proc.returncode == 2 and "algorithm.advantage='remax'" in proc.stderr
    cfg.pop("algorithm")
    cfg["rollout"]["source"]["env"] = "no_such_env"
    proc = ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)), check=False)
    assert (
        proc.returncode == 2
        and "'no_such_env' is not registered" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_a_hanging_environment_costs_its_episodes_not_the_run(tmp_path: Path, tiny_model: Path) -> None:
    """rollout.env_isolation=process (the default): one row's environment hangs at its first step; it is
    killed after env_timeout_s, its episodes (and those sharing its process) count as env/errors, the run
    finishes."""
    data = tmp_path / "data"
    data.mkdir()
    counter, hang = "tests.unit.envs.hostile:Counter", "tests.unit.envs.hostile:Hang"
    lines = [{"env": hang if i == 0 else counter, "turns": 2} for i in range(4)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = run_config(tmp_path, tiny_model, data, iterations=1, val_every=0)
    cfg["data"].pop("val_path")
    cfg["data"]["shuffle"] = False
    cfg["rollout"] |= {
        "source": {"name": "env", "env": counter, "max_turns": 3, "max_episode_tokens": 24},
        "env_timeout_s": 3.0,
        "env_workers": 2,
        "stop_token_ids": list(range(4, 40)),
    }
    cfg["reward"] = {"max_failure_rate": 0.9}
    cfg["train"]["max_tokens_per_micro_batch"] = 64
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    (metrics,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 1.0 <= metrics["env/errors"] < 8.0  # the hung row's episodes and its process-mates, not all
    assert (
        metrics["reward/mean"] > 0.0
    )  # the Counter episodes on the other process finished and were rewarded


@pytest.mark.slow
def test_ray_runs_environments_in_actors_kept_across_iterations(tmp_path: Path, tiny_model: Path) -> None:
    """cluster.backend=ray: the environments run in Ray actors. Iteration 1: row 0 hangs (its actor is killed
    after env_timeout_s and replaced, costing its 4 episodes), row 1's 4 Tally episodes count 1..4 in the
    other actor. Iteration 2: 8 Tally episodes, 4 per actor: the fresh actor counts 1..4, the one kept from
    iteration 1 goes on with 5..8 (actors restarted per batch would give 1..4 twice, reward/mean 2.5)."""
    from ascent.models.loading import load_tokenizer

    data = tmp_path / "data"
    data.mkdir()
    hostile = "tests.unit.envs.hostile"
    lines = [{"env": f"{hostile}:{name}", "turns": 1} for name in ("Hang", "Tally", "Tally", "Tally")]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = run_config(tmp_path, tiny_model, data, iterations=2, val_every=0)
    cfg["data"].pop("val_path")
    cfg["data"]["shuffle"] = False
    every_token = list(range(len(load_tokenizer(str(tiny_model)))))  # each turn is one token, and stops
    cfg["rollout"] |= {
        "source": {"name": "env", "env": f"{hostile}:Counter", "max_turns": 2, "max_episode_tokens": 16},
        "env_timeout_s": 3.0,
        "env_workers": 2,
        "stop_token_ids": every_token,
    }
    cfg["reward"] = {"max_failure_rate": 0.9}
    cfg["train"]["max_tokens_per_micro_batch"] = 64
    cfg["cluster"] = {"backend": "ray", "num_cpus": 4}
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)), timeout=300)
    run = tmp_path / "run"
    first, second = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert first["env/errors"] == 4.0 and first["reward/mean"] == (1 + 2 + 3 + 4) / 8
    assert second["env/errors"] == 0.0 and second["reward/mean"] == (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8) / 8
    log = (run / "logs" / "controller.log").read_text()
    assert "environments: 2 Ray actors of 1 CPU on 1 node(s)" in log and "timed out after 3 s" in log
    # each actor logs to its own file: the replacement of the hung one answered for the environments it lost
    assert "lost when its process was replaced" in (run / "logs" / "env_0.log").read_text()
