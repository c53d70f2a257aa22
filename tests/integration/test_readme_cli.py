"""The README's "Using it" commands run after the demo, against a small stand-in of what the demo writes.

The stand-in sits where `examples/arithmetic/run_demo.py` writes (`run_demo.paths`, under its default root,
in a temporary working directory with `examples/` linked in): a tiny model as `base/` and as the SFT run's
`final/`, 1-digit addition data, and a GRPO run directory holding a checkpoint, so a new run into it would
be refused (the test shows that it is). Each command of the README's block is then run through the CLI app
in this process (`typer`'s runner: the real argument parsing and commands, without a new interpreter and
torch import per command, which would cost about 5 s of CPU each):

- as written: `ascent sft`, `ascent eval`, `ascent config show`, `ascent doctor`;
- with small overrides appended (`TRAIN_OVERRIDES`: 1 iteration of 2 prompts with 4-token answers, then 2 on
  `--resume`; the README's own overrides, `run_dir` and `samples_per_prompt`, stay): the two `ascent train`
  lines, which would otherwise train for minutes;
- in a subprocess of its own with `--port 0` appended (a free port), until it answers `/api/runs` with the
  runs: `ascent studio`, a server that runs until stopped;
- not at all: the agent line, a template naming the reader's config and agent (`TEMPLATES`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from make_data import make
from run_demo import DEFAULT_ROOT, paths
from typer.testing import CliRunner

from ascent.cli import app
from ascent.models.tiny import make_tiny_checkpoint

TRAIN_OVERRIDES = [
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=4",
    "train.trajectories_per_update=16",
    "tracking.tensorboard=false",
]
TEMPLATES = ("run.yaml",)  # a command naming one of these is the reader's to fill in
WHAT_IT_SHOWS = ("train", "train", "sft", "eval", "config", "config", "doctor", "studio", "train")


def readme_commands() -> list[list[str]]:
    """The commands of the first bash block under `## Using it` (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md's 'Using it' section has no bash block"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    return [c for c in commands if c]


@pytest.fixture
def after_the_demo(tmp_path: Path) -> Path:
    """A working directory as the demo leaves it (small), with the repository's examples/."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    at = paths(tmp_path / DEFAULT_ROOT)
    make_tiny_checkpoint(at["base"], hidden_size=32, num_layers=2, seed=0)
    shutil.copytree(at["base"], at["sft"] / "final")
    make(at["data"], digits=1, sft=40, train=40, val=4, seed=0)
    (at["grpo"] / "checkpoints" / "iter_000150").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """Run `ascent ARGS` in this process (the CLI app itself, argument parsing included; no interpreter and
    torch import per command), from the stand-in's directory; returns its stdout. The log handlers the
    commands attach to the `ascent` logger are removed afterwards."""
    package = logging.getLogger("ascent")
    handlers, level = list(package.handlers), package.level
    runner = CliRunner()

    def run(args: list[str], exit_code: int = 0) -> str:
        result = runner.invoke(app, args, catch_exceptions=False)
        assert result.exit_code == exit_code, (
            f"ascent {shlex.join(args)}: exit {result.exit_code}\n{result.output}"
        )
        return result.output

    yield run
    for handler in [h for h in package.handlers if h not in handlers]:
        package.removeHandler(handler)
        handler.close()
    package.setLevel(level)


def studio_serves(cwd: Path, args: list[str]) -> list[str]:
    """Start `ascent studio ... --port 0`, read the URL it prints, return the run names `/api/runs` lists."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ascent", *args, "--port", "0"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # `ascent studio: <root> at http://127.0.0.1:PORT/...`
        url = re.search(r"(http://\S+)", line)
        assert url, line + proc.stdout.read() if proc.poll() is not None else line
        base, _, query = url.group(1).partition("?")
        with urllib.request.urlopen(f"{base.rstrip('/')}/api/runs?{query}", timeout=60) as response:
            return [json.dumps(r) for r in json.loads(response.read())["runs"]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_using_it_commands_run_after_the_demo(
    after_the_demo: Path, in_process: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(after_the_demo)
    commands = readme_commands()
    assert [c[:2] for c in commands] == [["ascent", name] for name in WHAT_IT_SHOWS]
    refused = in_process(["train", "examples/arithmetic/grpo.yaml"], exit_code=2)  # into the demo's run
    assert "already holds checkpoints" in refused
    trains = 0
    for args in (c[1:] for c in commands if not any(t in c for t in TEMPLATES)):
        if args[0] == "train":
            trains += 1
            out = in_process([*args, *TRAIN_OVERRIDES, f"iterations={trains}"])
            assert f"it {trains}/{trains}" in out  # the progress line, stdout not being a terminal
        elif args[0] == "studio":
            listed = studio_serves(after_the_demo, args)
            assert any("grpo16" in r for r in listed) and any("sft" in r for r in listed)
        else:
            out = in_process(args)
            assert args[0] != "eval" or "accuracy" in out
            assert "micro_batch" not in args or "train.max_tokens_per_micro_batch" in out
    grpo16 = after_the_demo / DEFAULT_ROOT / "grpo16"
    assert trains == 2 and sorted(p.name for p in (grpo16 / "checkpoints").iterdir()) == [
        "iter_000001",
        "iter_000002",
    ]
