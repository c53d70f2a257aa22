"""The README's plug-in examples through the real CLI, run from a directory that holds the user's `mypkg/`
and nothing on PYTHONPATH but ascent itself: `reward.fn=mypkg.rewards:score` (scored in the reward worker
processes, which resolve it too) and `ascent debug env --env mypkg.envs:GuessNumber`. Python runs with -P, as
the `ascent` console script does: the current directory is not on sys.path unless ascent puts it there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, run_config, write_yaml

REWARDS = """
def score(prompt, response, response_ids, metadata, **kwargs):
    return 1.0 if response.strip() == str(metadata.get("answer")) else 0.0
"""
ENVS = """
from ascent.envs import StepResult


class GuessNumber:
    def reset(self, row):
        self.target = int(row["target"])
        return [{"role": "user", "content": "Guess my number from 0 to 9."}]

    def step(self, action):
        if action.strip() == str(self.target):
            return StepResult(reward=1.0, done=True)
        return StepResult(observation=({"role": "user", "content": "try again"},))
"""


def user_dir(tmp_path: Path) -> Path:
    """A project directory as a user has it: mypkg/ (rewards, envs) and the rows."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rewards.py").write_text(REWARDS)
    (pkg / "envs.py").write_text(ENVS)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"target": t}) + "\n" for t in (3, 7)))
    return tmp_path


def ascent_in(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-P", "-m", "ascent", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_readme_plugins_load_from_the_current_directory(
    tmp_path: Path, tiny_model: Path, arithmetic_data: Path
):
    cwd = user_dir(tmp_path / "project")
    proc = ascent_in(
        cwd,
        "debug",
        "env",
        "--model",
        str(tiny_model),
        "--data",
        "rows.jsonl",
        "--env",
        "mypkg.envs:GuessNumber",
        "--episodes",
        "1",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "3",
    )
    assert proc.returncode == 0 and proc.stdout.count("=== row") == 1, proc.stderr

    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    cfg["data"].pop("val_path")
    cfg["reward"] = {"fn": "mypkg.rewards:score", "isolation": "process", "num_workers": 1}
    cfg["tracking"] |= {"tensorboard": False, "trace": False, "experience_store": False}
    proc = ascent_in(cwd, "train", str(write_yaml(tmp_path / "reward.yaml", cfg)))
    assert proc.returncode == 0, proc.stderr  # a reward worker that cannot import mypkg fails every sample
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("reward/mean") >= 1


def test_a_missing_package_names_where_it_looked_and_the_fix(tmp_path: Path, tiny_model: Path) -> None:
    cwd = user_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = ascent_in(
        elsewhere,
        "debug",
        "env",
        "--model",
        str(tiny_model),
        "--data",
        str(cwd / "rows.jsonl"),
        "--env",
        "mypkg.envs:GuessNumber",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no module 'mypkg'" in proc.stderr and str(elsewhere.resolve()) in proc.stderr
    assert "Run ascent from the directory that holds `mypkg/`" in proc.stderr and "PYTHONPATH" in proc.stderr
    # a misspelt name in a module that exists lists its callables: tests/unit/test_plugins.py


LEAVES = """
import os
print("bye from mypkg.leaves")
os._exit(0)

def score(prompt, response, response_ids, metadata):
    return 1.0

class Env:
    pass
"""


@pytest.mark.parametrize(
    ("field", "setting"),
    [
        ("reward.fn", {"reward": {"fn": "mypkg.leaves:score"}}),
        ("algorithm.advantage", {"algorithm": {"advantage": "mypkg.leaves:score"}}),
        ("rollout.source.env", {"rollout": {"source": {"name": "env", "env": "mypkg.leaves:Env"}}}),
    ],
)
def test_a_plugin_that_ends_its_process_at_import_fails_the_run_naming_it(
    tmp_path: Path, tiny_model: Path, arithmetic_data: Path, field: str, setting: dict
) -> None:
    # before: `ascent train` ended with status 0 (the reward fn's and the algorithm's os._exit ended the
    # controller), or with every start-up reset failing as "its process died" (the environment's)
    cwd = user_dir(tmp_path / "project")
    (cwd / "mypkg" / "leaves.py").write_text(LEAVES)
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    cfg["train"]["max_tokens_per_micro_batch"] = 1024  # an env source's episodes are longer
    for section, values in setting.items():
        cfg[section] = cfg.get(section, {}) | values
    proc = ascent_in(cwd, "train", str(write_yaml(tmp_path / "leaves.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{field}='mypkg.leaves:" in proc.stderr and "Traceback" not in proc.stderr
    assert (
        "importing 'mypkg.leaves' ended its process (exit status 0) before the import returned" in proc.stderr
    )
    assert "its last output: 'bye from mypkg.leaves'" in proc.stderr
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "crashed"
