"""Fixtures for the integration tests: a tiny checkpoint and the arithmetic data, made once per session."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from ascent.models.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("model") / "tiny", hidden_size=32, num_layers=2, seed=0
    )


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory) -> Path:
    from make_data import make

    return make(tmp_path_factory.mktemp("data"), digits=1, sft=40, train=40, val=16, seed=0)


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory, arithmetic_data):
    """A tiny model after a short SFT on 1-digit sums: about a quarter of sampled answers right (the warm
    start of test_algorithms_learn.py; test_fsdp_curve.py starts from it too, instead of its own SFT)."""
    from ascent.models.tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("warm")
    base = make_tiny_checkpoint(root / "base", hidden_size=64, num_layers=2, seed=0)
    cfg = {
        "run_dir": str(root / "sft"),
        "epochs": 40.0,
        "batch_size": 8,
        "model": {"path": str(base)},
        "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 256},
        "tracking": {"progress": False, "tensorboard": False},
    }
    ascent_here("sft", str(write_yaml(root / "sft.yaml", cfg)))
    return root / "sft" / "final"


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray cluster the module's Ray runs join through `cluster.address`, instead of each `ascent`
    process starting and stopping a cluster of its own (about 7 s of CPU a run, on 2 cores). It has what a
    cluster that `init_ray` starts would have: this machine's CPUs, and this checkout on its workers'
    PYTHONPATH. Its files, address file included, live under a directory of its own (RAY_TMPDIR while it
    starts), so nothing else on this machine joins it. One per module, not per session: starting one takes
    about 2 s of CPU, and an idle one about 3% of a core (minutes of other modules lie between the users).
    test_env_train_cli's Ray run still starts its own (cluster.num_cpus)."""
    from ray.cluster_utils import Cluster

    saved, own = dict(os.environ), tempfile.mkdtemp(prefix="ray")
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ.update(RAY_TMPDIR=own, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")
    try:  # the nodes inherit this environment, as a local cluster's inherit its driver's
        cpus = len(os.sched_getaffinity(0))
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False})
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()
        shutil.rmtree(own, ignore_errors=True)


def run_config(tmp_path: Path, model: Path, data: Path, **overrides) -> dict:
    """A small but complete `ascent train` config: 2 prompts x 4 samples, 4-token responses."""
    cfg = {
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
        "iterations": 3,
        "val_every": 2,
        "model": {"path": str(model)},
        "data": {
            "train_path": str(data / "train.jsonl"),
            "val_path": str(data / "val.jsonl"),
            "max_prompt_tokens": 32,
        },
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 4},
        "train": {"lr": 1e-3, "trajectories_per_update": 4, "max_tokens_per_micro_batch": 64},
        "tracking": {"progress": False},
    }
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if field:
            cfg.setdefault(section, {})[field] = value
        else:
            cfg[section] = value
    return cfg


def write_yaml(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def ascent_here(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real `ascent` CLI app in this process (argument parsing, config loading and the command as
    `ascent()` runs them, without a new interpreter importing torch and transformers: seconds per command on
    a small CPU), for tests of what a command does rather than of its process (exit on a signal, stderr
    apart from stdout). The log handlers, environment variables and sys.path entries the command adds are
    removed afterwards. Returns what `ascent()` returns. (Python warnings don't reach its stderr: pytest
    records them; a test of what a command warns runs it with `ascent()`.)"""
    from typer.testing import CliRunner

    from ascent.cli import app
    from ascent.plugins import add_plugin_root

    package = logging.getLogger("ascent")
    handlers, level = list(package.handlers), package.level
    environ, path = dict(os.environ), list(sys.path)
    try:
        add_plugin_root()  # as `main()` does: plug-ins resolve from the current directory, in workers too
        result = CliRunner().invoke(app, list(args), catch_exceptions=False, prog_name="ascent")
    finally:
        for handler in [h for h in package.handlers if h not in handlers]:
            package.removeHandler(handler)
            handler.close()
        package.setLevel(level)
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
    proc = subprocess.CompletedProcess(["ascent", *args], result.exit_code, result.stdout, result.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"ascent {' '.join(args)} exited {proc.returncode}\n{result.output}")
    return proc


def ascent(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real `ascent` CLI in a subprocess."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ascent", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"ascent {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def vision_comparison(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., str]:
    """`examples/vision/run_comparison.py ARGS` with each of its `ascent` steps run by `ascent_here` (the same
    commands, configs and overrides, without a new interpreter importing torch and transformers: about 5 s
    of CPU a step, 6 steps a comparison). Returns what the script printed."""
    import importlib.util

    path = ROOT / "examples" / "vision" / "run_comparison.py"
    spec = importlib.util.spec_from_file_location("run_comparison", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def step(*args: str) -> None:
        print(f"$ ascent {' '.join(args)}", flush=True)
        ascent_here(*args)

    def run(*args: str) -> str:
        monkeypatch.setattr(module, "sh", step)
        monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts examples/vision first: undone after
        capsys.readouterr()
        module.main(list(args))
        return capsys.readouterr().out

    return run


@pytest.fixture(scope="session")
def lookup_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[int]]:
    """The lookup game's data (`lookup_env.py`) and a warm start that asks about half the time: SFT on 200
    conversations, half asking then repeating the secret, half guessing."""
    import json
    import random

    from ascent.models.tiny import make_tiny_checkpoint
    from tests.integration.lookup_env import conversation

    root = tmp_path_factory.mktemp("lookup")
    rng = random.Random(0)
    demos = [conversation(rng.randrange(10), i % 2 == 0, rng.randrange(10)) for i in range(200)]
    (root / "sft.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))
    secrets = [rng.randrange(10) for _ in range(16)]
    (root / "train.jsonl").write_text("".join(json.dumps({"secret": s}) + "\n" for s in secrets))
    base = make_tiny_checkpoint(root / "base", hidden_size=64, num_layers=2, seed=0)
    cfg = {
        "run_dir": str(root / "sft"),
        "epochs": 20.0,
        "batch_size": 16,
        "model": {"path": str(base)},
        "data": {"train_path": str(root / "sft.jsonl"), "max_prompt_tokens": 16},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 512},
        "tracking": {"progress": False, "tensorboard": False},
    }
    ascent_here("sft", str(write_yaml(root / "sft.yaml", cfg)))
    return root, root / "sft" / "final", secrets
