"""The `ascent` command: config show, error handling and exit codes, lazy orchestrator calls, bench."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ascent.cli import app
from ascent.config import RunConfig, load_config
from ascent.config.explain import explain_rows
from ascent.data.fields import RowFields
from ascent.entrypoints.guard import is_user_error
from ascent.errors import AscentError

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    cmd = [sys.executable, "-m", "ascent", *args]
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120)


def test_config_show_prints_resolved_yaml(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"model": {"path": "models/tiny"}, "train": {"lr": 1e-5}})
    result = runner.invoke(app, ["config", "show", str(path), "rollout.stop_token_ids=[7]"])
    assert result.exit_code == 0, result.output
    shown = yaml.safe_load(result.stdout)
    assert shown["model"]["path"] == "models/tiny" and shown["rollout"]["stop_token_ids"] == [7]
    out = tmp_path / "shown.yaml"
    out.write_text(result.stdout)
    assert load_config(out, []) == load_config(path, ["rollout.stop_token_ids=[7]"])


def test_config_show_without_a_file_shows_defaults() -> None:
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0
    assert load_config(None, []) == RunConfig.model_validate(yaml.safe_load(result.stdout))
    result = runner.invoke(app, ["config", "show", "seed=3"])
    assert yaml.safe_load(result.stdout)["seed"] == 3


def test_config_show_explain() -> None:
    result = runner.invoke(app, ["config", "show", "train.lr=1e-5", "--explain"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Peak learning rate of AdamW." in result.stdout
    assert "1e-05" in result.stdout and "1e-06" in result.stdout  # value and default


def test_config_show_explain_piped_is_one_plain_line_per_field(tmp_path: Path) -> None:
    """Not a terminal (a pipe, CliRunner): no table, so a long field name is never broken and grep finds
    it."""
    result = runner.invoke(app, ["config", "show", "--explain"], env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(explain_rows(load_config(None))) and all(
        re.match(r"^[a-z_.]+=", x) for x in lines
    )
    (line,) = [line for line in lines if line.startswith("train.max_tokens_per_micro_batch=")]
    assert line == (
        "train.max_tokens_per_micro_batch=8192  (default: 8192)  Token budget of one forward pass; sequences "
        "are packed up to it."
    )


def test_config_show_explain_looks_fields_up_by_name(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"train": {"max_tokens_per_micro_batch": 1024}})
    args = ["config", "show", str(path), "--explain", "micro_batch", "seed", "seed=4"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "train.max_tokens_per_micro_batch=1024 *  (default: 8192)  Token budget of one forward pass; "
        "sequences are packed up to it.",
        "seed=4 *  (default: 0)  Seed of data order, sampling and initialisation.",
    ]
    typo = runner.invoke(app, ["config", "show", "--explain", "max_tokens_per_microbatch"])
    assert typo.exit_code == 2 and "did you mean train.max_tokens_per_micro_batch?" in typo.stderr


def test_config_show_sft(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"epochs": 2, "batch_size": 4})
    result = runner.invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 2
    assert "add --sft" in result.stderr
    result = runner.invoke(app, ["config", "show", str(path), "--sft"])
    assert result.exit_code == 0 and yaml.safe_load(result.stdout)["batch_size"] == 4
    # a rule of RL runs only (no SFT-only key refused): no --sft hint, though the SFT schema would pass it
    result = runner.invoke(app, ["config", "show", "model.lora.publish=adapter"])
    assert result.exit_code == 2 and "model.lora.publish=adapter" in result.stderr
    assert "add --sft" not in result.stderr


def test_malformed_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"model": {"path": "m"}, "rollout": {"samples_per_promt": 4}})
    result = runner.invoke(app, ["train", str(path)])
    assert result.exit_code == 2
    assert (
        "error: unknown key 'rollout.samples_per_promt'; did you mean 'rollout.samples_per_prompt'?"
        in result.stderr
    )
    assert "Traceback" not in result.output


def test_malformed_config_in_a_real_process(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"model": {"path": "m"}, "train": {"lr": -1}})
    result = run_cli("train", str(path))
    assert result.returncode == 2
    assert "error: train.lr=-1: must be > 0 (Peak learning rate of AdamW)." in result.stderr
    assert "Traceback" not in result.stderr
    debug = run_cli("train", str(path), env={"ASCENT_DEBUG": "1"})
    assert debug.returncode == 2 and "Traceback" in debug.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "missing.yaml"], "config file 'missing.yaml' not found"),
        (["train", "run.yaml", "foo"], "override 'foo' has no '='"),
        (["train", "run.yaml"], "model.path is not set"),
        (["sft", "run.yaml", "rollout.samples_per_prompt=2"], "unknown key 'rollout'"),
    ],
)
def test_user_errors_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, {})
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_train_calls_the_orchestrator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[RunConfig] = []
    options: list[dict[str, Any]] = []

    def run_training(cfg: RunConfig, **kwargs: Any) -> dict:
        seen.append(cfg)
        options.append(kwargs)
        return {}

    fake_module(monkeypatch, "ascent.entrypoints.train", run_training=run_training)
    path = write_config(tmp_path, {"model": {"path": "m"}})
    result = runner.invoke(app, ["train", str(path), "seed=5", "--resume"])
    assert result.exit_code == 0, result.output
    assert seen[0].seed == 5 and seen[0].resume and seen[0].model.path == "m"
    assert options[0] == {"resume_from": None, "accept_changes": False}
    result = runner.invoke(app, ["train", str(path), "--resume-from", "iter_000002", "--accept-changes"])
    assert result.exit_code == 0, result.output
    assert seen[1].resume and options[1] == {"resume_from": "iter_000002", "accept_changes": True}


def test_train_accepts_overrides_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[RunConfig] = []
    fake_module(monkeypatch, "ascent.entrypoints.train", run_training=lambda cfg, **kw: seen.append(cfg))
    result = runner.invoke(app, ["train", "model.path=m", "seed=2"])
    assert result.exit_code == 0, result.output
    assert (seen[0].model.path, seen[0].seed) == ("m", 2)


def test_sft_calls_the_orchestrator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    fake_module(monkeypatch, "ascent.entrypoints.sft", run_sft=lambda cfg, **kw: seen.append(cfg))
    path = write_config(tmp_path, {"model": {"path": "m"}, "epochs": 2})
    result = runner.invoke(app, ["sft", str(path), "--resume"])
    assert result.exit_code == 0, result.output
    assert seen[0].epochs == 2 and seen[0].resume


def _raise(exc: BaseException) -> Any:
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fn


def test_interrupt_exits_130_and_promises_only_an_existing_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fake_module(monkeypatch, "ascent.entrypoints.train", run_training=_raise(KeyboardInterrupt()))
    result = runner.invoke(app, ["train", "model.path=m", "run_dir=runs/x"])
    assert result.exit_code == 130
    assert "No checkpoint of this run exists yet" in result.stderr and "--resume" not in result.stderr
    ckpt = tmp_path / "runs" / "x" / "checkpoints" / "iter_000003"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text("{}")
    result = runner.invoke(app, ["train", "model.path=m", "run_dir=runs/x"])
    assert result.exit_code == 130
    assert "iter_000003" in result.stderr and "--resume" in result.stderr


def test_errors_from_deeper_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    class DataError(Exception):  # stands in for ascent.data.DataError, matched by name
        pass

    fake_module(
        monkeypatch, "ascent.entrypoints.train", run_training=_raise(DataError("rows.jsonl: row 3: bad"))
    )
    result = runner.invoke(app, ["train", "model.path=m"])
    assert result.exit_code == 2 and "error: rows.jsonl: row 3: bad" in result.stderr

    fake_module(monkeypatch, "ascent.entrypoints.train", run_training=_raise(RuntimeError("a bug")))
    result = runner.invoke(app, ["train", "model.path=m"])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)


def test_is_user_error() -> None:
    class Sub(AscentError):
        pass

    assert is_user_error(Sub("x")) and not is_user_error(ValueError("x"))


def test_eval_forwards_options_and_prints_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def run_eval(**kwargs: Any) -> dict[str, float]:
        seen.update(kwargs)
        return {"accuracy": 0.25, "reward_mean": 0.5, "responses": 8.0}

    def run_env_eval(*args: Any, **kwargs: Any) -> dict[str, float]:
        raise AssertionError("no --env: the reward path runs")

    fake_module(
        monkeypatch,
        "ascent.entrypoints.evaluate",
        run_eval=run_eval,
        run_env_eval=run_env_eval,
        run_agent_eval=run_env_eval,
    )
    args = [
        "eval",
        "--model",
        "m",
        "--data",
        "d.jsonl",
        "--samples",
        "2",
        "--max-prompts",
        "4",
        "--temperature",
        "0.7",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen == {
        "model": "m",
        "data": "d.jsonl",
        "reward": "exact_match",
        "max_new_tokens": 256,
        "temperature": 0.7,
        "samples": 2,
        "pass_k": (),
        "fields": RowFields(),
        "out": None,
        "max_prompts": 4,
        "device": "auto",
        "engine": "reference",
        "dtype": "fp32",
        "reward_timeout_s": None,
        "progress": True,
        "reward_config": None,
    }
    assert "accuracy: 0.2500" in result.stdout and "responses: 8" in result.stdout
    assert runner.invoke(app, [*args, "--reward-config", "run.yaml"]).exit_code == 0
    assert seen["reward_config"] == "run.yaml"
    result = runner.invoke(app, [*args, "--reward-config", "run.yaml", "--env", "guess_number"])
    assert result.exit_code == 2 and "drop --reward-config" in result.output


def test_eval_pass_k_is_parsed_and_checked_against_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def run_eval(**kwargs: Any) -> dict[str, float]:
        seen.update(kwargs)
        return {"pass@4": 0.5}

    fake_module(
        monkeypatch,
        "ascent.entrypoints.evaluate",
        run_eval=run_eval,
        run_env_eval=run_eval,
        run_agent_eval=run_eval,
    )
    base = ["eval", "--model", "m", "--data", "d.jsonl", "--samples", "4"]
    result = runner.invoke(app, [*base, "--pass-k", "1, 4"])
    assert result.exit_code == 0 and seen["pass_k"] == (1, 4) and "pass@4: 0.5" in result.stdout
    for bad, says in (("8", "each k must lie in 1..--samples=4"), ("1,x", "whole numbers separated")):
        result = runner.invoke(app, [*base, "--pass-k", bad])
        assert result.exit_code == 2 and says in result.output
    result = runner.invoke(app, [*base, "--env", "guess_number", "--system-prompt", "S"])
    assert result.exit_code == 2 and "the environment (or the agent) writes the prompts" in result.output


def test_eval_with_env_plays_episodes(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def run_env_eval(model: str, data: str, env: str, **kwargs: Any) -> dict[str, float]:
        seen.update(model=model, data=data, env=env, **kwargs)
        return {"accuracy": 0.5, "turns_mean": 2.0}

    def run_eval(**kwargs: Any) -> dict[str, float]:
        raise AssertionError("--env: the episode path runs")

    fake_module(
        monkeypatch,
        "ascent.entrypoints.evaluate",
        run_eval=run_eval,
        run_env_eval=run_env_eval,
        run_agent_eval=run_eval,
    )
    args = ["eval", "--model", "m", "--data", "d.jsonl", "--env", "python_math", "--max-turns", "3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    got = (seen["env"], seen["max_turns"], seen["max_episode_tokens"], seen["temperature"])
    assert got == ("python_math", 3, 512, 0.0)
    assert "accuracy: 0.5000" in result.stdout and "turns_mean: 2" in result.stdout


def test_eval_with_agent_plays_it_against_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def run_agent_eval(model: str, data: str, agent: str, **kwargs: Any) -> dict[str, float]:
        seen.update(model=model, data=data, agent=agent, **kwargs)
        return {"accuracy": 0.5, "agent_errors": 1.0}

    def other(*args: Any, **kwargs: Any) -> dict[str, float]:
        raise AssertionError("--agent: the agent path runs")

    fake_module(
        monkeypatch,
        "ascent.entrypoints.evaluate",
        run_eval=other,
        run_env_eval=other,
        run_agent_eval=run_agent_eval,
    )
    args = [
        "eval",
        "--model",
        "m",
        "--data",
        "d.jsonl",
        "--agent",
        "pkg.mod:run",
        "--agent-timeout-s",
        "5",
        "--max-prompt-tokens",
        "64",
        "--reward",
        "format",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    got = (
        seen["agent"],
        seen["agent_timeout_s"],
        seen["max_prompt_tokens"],
        seen["reward"],
        seen["temperature"],
    )
    assert got == ("pkg.mod:run", 5.0, 64, "format", 0.0) and seen["max_episode_tokens"] == 512
    assert "accuracy: 0.5000" in result.stdout and "agent_errors: 1" in result.stdout


def test_bench_forwards_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rollout.py").write_text(
        "def main(argv):\n    print('ARGS', argv)\n    return 3 if '--fail' in argv else 0\n"
    )
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["bench", "rollout", "--batch", "8", "--help"])
    assert result.exit_code == 0, result.output
    assert "ARGS ['--batch', '8', '--help']" in result.stdout
    assert runner.invoke(app, ["bench", "rollout", "--fail"]).exit_code == 3


def test_bench_missing_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("ascent.cli.REPO_ROOT", tmp_path)
    result = runner.invoke(app, ["bench", "e2e"])
    assert result.exit_code == 2 and "bench/e2e.py not found" in result.stderr


def test_help_and_version_via_python_m() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("train", "sft", "eval", "config", "bench", "version"):
        assert command in result.stdout
    version = run_cli("version")
    assert version.returncode == 0 and version.stdout.startswith("ascent ")
