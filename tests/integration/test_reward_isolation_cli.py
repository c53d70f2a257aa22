"""User reward code that hangs, raises, exits or kills its process costs those samples, never the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import run_config, write_yaml

HERE = Path(__file__).resolve().parent
BAD = ["hang", "exit", "os_exit", "kill", "raise"]


def train(cfg_yaml):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "ascent", "train", str(cfg_yaml)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def one_iteration(tmp_path, tiny_model, arithmetic_data, answers, reward):
    """A one-iteration run over one prompt per answer (2 samples each) that `bad_rewards:score` scores
    according to the answer, with `reward` as the reward section (the function added)."""
    rows = [{"prompt": f"{i}+1=", "answer": how} for i, how in enumerate(answers)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    cfg["data"] = {"train_path": str(data), "max_prompt_tokens": 32, "shuffle": False}
    cfg["rollout"].update(prompts_per_step=len(answers), samples_per_prompt=2)
    cfg["train"]["trajectories_per_update"] = 2 * len(answers)
    cfg["reward"] = {"fn": "bad_rewards:score", **reward}
    return write_yaml(tmp_path / "r.yaml", cfg)


def config(tmp_path, tiny_model, arithmetic_data, max_failure_rate):
    reward = {"timeout_s": 1.0, "max_failure_rate": max_failure_rate}
    return one_iteration(tmp_path, tiny_model, arithmetic_data, BAD + ["ok", "ok", "ok"], reward)


def test_failures_cost_their_samples_and_the_run_finishes(tmp_path, tiny_model, arithmetic_data):
    proc = train(config(tmp_path, tiny_model, arithmetic_data, max_failure_rate=0.8))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["reward/failures"] == 10.0  # 5 bad rows x 2 samples; the 3 good rows score 1.0 each
    assert abs(row["reward/mean"] - 6 / 16) < 1e-6
    out = proc.stdout + proc.stderr
    assert "timed out after 1 s" in out and "SystemExit: 3" in out
    assert (tmp_path / "run" / "checkpoints" / "iter_000001").is_dir()


def test_over_the_failure_bound_the_run_stops_with_a_message(tmp_path, tiny_model, arithmetic_data):
    proc = train(config(tmp_path, tiny_model, arithmetic_data, max_failure_rate=0.5))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "10 of 16 reward calls failed" in out and "reward.max_failure_rate=0.5" in out
    assert "Traceback" not in out


def test_a_reward_past_its_memory_or_output_cap_costs_nothing_else(tmp_path, tiny_model, arithmetic_data):
    # before: a reward could take all the machine's memory, and print without end into the run's console
    reward = {"memory_limit_mb": 1024, "max_failure_rate": 0.5}
    proc = train(one_iteration(tmp_path, tiny_model, arithmetic_data, ["hog", "loud", "ok", "ok"], reward))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["reward/failures"] == 2.0  # the hog's two samples; the loud row scores like the good ones
    assert (
        "MemoryError" in out
        and "(over the 1024 MiB each reward process may use: reward.memory_limit_mb)" in out
    )
    assert len(proc.stdout) < 1 << 20 and "one call printed 16.0 MiB to stdout" in proc.stderr
