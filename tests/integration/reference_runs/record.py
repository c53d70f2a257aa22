"""The reference runs of issue #27: seven tiny runs through the real CLI, each reduced to a JSON summary (its
sampled episodes token for token, its metrics per step, a digest of its final weights) that
`test_reference_runs.py` compares with the stored `<kind>.json` files in this folder.

`python -m tests.integration.reference_runs.record` (from the repository root) runs them all and rewrites the
JSON files; `--kinds grpo,sft` picks some, `--out DIR` writes elsewhere (to compare two settings), `--seed N`
runs another seed (to measure seed noise). Re-record only on a deliberate change of behaviour, and name it in
the commit (README.md here).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ascent.models.tiny import make_tiny_checkpoint
from ascent.tracking.experience_store import open_store

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
SOURCES = "tests.integration.reference_runs.sources"
KINDS = ("grpo", "ppo", "env", "agent", "async", "sft", "resume")
# metrics that measure time, speed or memory: they differ between any two runs
UNSTABLE_PREFIXES = ("time", "perf/", "memory/", "agent/seconds")
SAMPLED = 4  # values sampled from each tensor, evenly spaced over its flattened elements


def make_inputs(root: Path) -> tuple[Path, Path]:
    """The tiny model (hidden 32, 2 layers, seed 0) and the 1-digit sums of examples/arithmetic."""
    sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))
    from make_data import make  # examples/ is no package: importable from its folder only

    model = make_tiny_checkpoint(root / "model", hidden_size=32, num_layers=2, seed=0)
    return model, make(root / "data", digits=1, sft=40, train=40, val=16, seed=0)


def train_config(run_dir: Path, model: Path, data: Path) -> dict[str, Any]:
    """Single-turn GRPO: 3 iterations of 2 prompts x 4 samples, 4-token responses, a checkpoint each."""
    return {
        "run_dir": str(run_dir),
        "seed": 3,
        "iterations": 3,
        "val_every": 0,
        "model": {"path": str(model)},
        "data": {"train_path": str(data / "train.jsonl"), "max_prompt_tokens": 32},
        "reward": {"fn": f"{SOURCES}:score", "num_workers": 1},
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 4},
        "train": {"lr": 1e-3, "trajectories_per_update": 4, "max_tokens_per_micro_batch": 64},
        "checkpoint": {"every": 1, "keep_last": 3},
        "tracking": {"progress": False, "tensorboard": False, "trace": False},
    }


def configs(root: Path, model: Path, data: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """kind -> (the `ascent` command, its config); `resume` is the GRPO config, killed and resumed."""
    multi_turn = {"max_turns": 2, "max_episode_tokens": 16, "env_workers": 1}
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for kind in ("grpo", "ppo", "env", "agent", "async", "resume"):
        cfg = train_config(root / kind, model, data)
        if kind == "ppo":
            cfg["algorithm"] = {"advantage": {"name": "gae", "lam": 0.95}, "critic_lr": 1e-3}
        elif kind == "env":
            # every ordinary character ends a turn: one-character answers, two turns an episode
            cfg["rollout"] |= {"env": f"{SOURCES}:Digits", "stop_token_ids": list(range(4, 40)), **multi_turn}
            del cfg["reward"]  # the environment scores its episodes (reward.* with rollout.env is refused)
        elif kind == "agent":
            cfg["rollout"] |= {"agent": f"{SOURCES}:agent", "agent_concurrency": 1, **multi_turn}
        elif kind == "async":
            cfg["rollout"]["max_staleness"] = 1
        out[kind] = ("train", cfg)
    out["sft"] = (
        "sft",
        {
            "run_dir": str(root / "sft"),
            "seed": 3,
            "epochs": 1.0,
            "batch_size": 8,
            "model": {"path": str(model)},
            "data": {"train_path": str(data / "sft.jsonl"), "max_prompt_tokens": 32},
            "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 128},
            "tracking": {"progress": False, "tensorboard": False},
        },
    )
    return out


def ascent(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start the real `ascent` CLI from the repository root."""
    return subprocess.Popen(
        [sys.executable, "-m", "ascent", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], what: str) -> None:
    out = proc.communicate(timeout=600)[0]
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited {proc.returncode}:\n{out}")


def run(kind: str, command: str, cfg: dict[str, Any]) -> Path:
    """Run one reference run; returns its run_dir. `resume`: SIGKILL once the first checkpoint is complete
    (the reward sleeps 0.1 s a call until then, so two iterations are left), then `--resume`."""
    run_dir = Path(cfg["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir.parent / f"{kind}.json"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    if kind != "resume":
        finish(ascent(command, str(path)), kind)
        return run_dir
    proc = ascent(command, str(path), env={"REFERENCE_RUNS_SLOW_S": "0.1"})
    first = run_dir / "checkpoints" / "iter_000001" / "state.json"
    deadline = time.time() + 300
    while not first.exists():
        if proc.poll() is not None:
            raise RuntimeError("the run ended before it could be killed:\n" + proc.communicate()[0])
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("no first checkpoint in 300 s")
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    if (run_dir / "checkpoints" / f"iter_{cfg['iterations']:06d}").exists():
        raise RuntimeError("killed too late: the run had finished")
    finish(ascent(command, str(path), "--resume"), "resume")
    return run_dir


def summarize(run_dir: Path, command: str) -> dict[str, Any]:
    """A run as JSON: metrics per step, the trained episodes (train only), a digest of the final weights."""
    summary: dict[str, Any] = {"metrics": metrics(run_dir)}
    if command == "train":
        summary["episodes"] = episodes(run_dir)
        final = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]
    else:
        final = run_dir / "final"
    summary["weights"] = digest(final / "model.safetensors")
    if (final / "critic").is_dir():  # PPO's value model: backbone and head
        summary["critic_weights"] = digest(final / "critic" / "model.safetensors")
    return summary


def metrics(run_dir: Path) -> list[dict[str, float]]:
    """metrics.jsonl without the wall-clock, speed and memory measurements."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in x.items() if not k.startswith(UNSTABLE_PREFIXES)} for x in lines]


def episodes(run_dir: Path) -> list[dict[str, Any]]:
    """Every episode of the experience store: what was sampled (token ids), masked, rewarded and trained."""
    with open_store(run_dir) as store:
        return [
            {
                "iteration": r.iteration,
                "group": r.group_index,
                "row_id": r.row_id,
                "status": r.status,
                "reward": r.reward,
                "finish": r.finish_reason,
                "turns": r.turns,
                "policy_version": r.policy_version,
                "prompt_ids": r.prompt_ids,
                "response_ids": r.response_ids,
                "loss_mask": r.loss_mask,
                "advantage": r.advantage,
                "sampler_logprobs": r.sampler_logprobs,
            }
            for r in store.iter_episodes()
        ]


def digest(weights: Path) -> dict[str, dict[str, Any]]:
    """Per tensor of a safetensors file, in float64: shape, sum, abs-sum, abs-max and SAMPLED values."""
    out = {}
    for name, t in sorted(load_file(str(weights)).items()):
        flat = t.detach().to(torch.float64).flatten()
        idx = torch.linspace(0, flat.numel() - 1, SAMPLED).long().unique()
        out[name] = {
            "shape": list(t.shape),
            "dtype": str(t.dtype),
            "sum": flat.sum().item(),
            "abs_sum": flat.abs().sum().item(),
            "abs_max": flat.abs().max().item(),
            "values": flat[idx].tolist(),
        }
    return out


def dumps(summary: dict[str, Any]) -> str:
    """JSON with one line per episode, metrics step and tensor: a re-recording's diff reads line by line."""
    parts = []
    for key, value in sorted(summary.items()):
        if isinstance(value, dict):
            lines = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in value.items()]
            brackets = "{}"
        else:
            lines = [json.dumps(v, sort_keys=True) for v in value]
            brackets = "[]"
        body = "\n  " + ",\n  ".join(lines) + "\n " if lines else ""
        parts.append(f" {json.dumps(key)}: {brackets[0]}{body}{brackets[1]}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def record(kinds: list[str], out: Path, work: Path, seed: int | None = None) -> None:
    model, data = make_inputs(work / "inputs")
    plan = configs(work, model, data)
    for kind in kinds:
        command, cfg = plan[kind]
        if seed is not None:
            cfg["seed"] = seed
        start = time.time()
        summary = summarize(run(kind, command, cfg), command)
        (out / f"{kind}.json").write_text(dumps(summary))
        print(f"{kind}: {time.time() - start:.1f} s -> {out / f'{kind}.json'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " + ", ".join(KINDS))
    parser.add_argument("--out", type=Path, default=HERE, help="where the JSON files go")
    parser.add_argument(
        "--seed",
        type=int,
        help="another run seed than the references' 3 (to measure seed noise); needs --out",
    )
    args = parser.parse_args()
    if args.seed is not None and args.out == HERE:
        parser.error("--seed records other runs than the references: give them their own --out folder")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        record(args.kinds.split(","), args.out, Path(work), args.seed)


if __name__ == "__main__":
    main()
