"""Embodied GPU benchmark (issue #29): a Qwen2.5-VL-3B-shape VLA on MuJoCo's Pusher-v5 in pixels.

    python bench/embodied_gpu.py --json OUT/embodied.json            # the GPU run (bench/embodied_gpu.sh)
    python bench/embodied_gpu.py --shape tiny --device cpu           # a CPU check of the same path

Three measurements, in one process:
1. Simulators alone: `--episodes` Pusher-v5 episodes rendered to 128 px frames (MUJOCO_GL=egl), stepped in
   blocks of `--copies` by `--workers` host processes (`ascent.envs.sim.HostedSimEnvs`, the path
   `rollout.source.sims_per_worker` takes) with random action words: environment steps per second.
2. The policy's turn alone: one batch of `--episodes` first observations (the prompt with its frame) through
   the rollout engine (`--engine`: reference, or fast: its session cache keeps an episode's earlier frames
   and actions, so a turn prefills only its new frame), sampling the 7 action tokens of one step among the
   256 bins (`rollout.action_token_ids`): ms per policy step for the whole batch.
3. GRPO through the real CLI (`ascent train`, inline, colocated, bf16, gradient checkpointing, `--engine`):
   the VLA plays
   `--prompts` x `--samples` episodes of `--max-steps` steps (every step's frame an image, 7 action tokens a
   turn, OpenVLA's 256 bins per dimension), iteration time per phase (`time/*`), return and success rate per
   iteration, environment steps per second over the rollout phase, and the process's peak GPU memory.

The model has random weights at Qwen2.5-VL-3B's dimensions (bench/vl_workload.py's `vl_config`) and
ascent's character tokenizer with the action words `<a0>`..`<a255>` as single tokens. Success: a return of
`--success-return` or more (default -22: a uniform random policy reaches it in 13% of 16-step episodes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vl_workload as V  # noqa: E402

TASK = "Pusher-v5"
BINS = 256  # per action dimension, as OpenVLA
DIMS = 7  # Pusher's arm: 7 joint torques, one action token each (OpenVLA's actions are 7-dimensional too)
WORDS = [f"<a{k}>" for k in range(BINS)]
PHASES = ("generate", "reward", "logprobs", "advantages", "update", "publish")


def make_checkpoint(root: Path, shape: str, image_size: int, device: str) -> Path:
    """Write (once) the random-weight VLA: `shape`'s Qwen2.5-VL with the action words in its vocabulary."""
    from transformers import AutoModelForImageTextToText

    from ascent.models.tiny import make_char_tokenizer
    from ascent.models.tiny_vl import VISION_TOKENS, VL_CHAT_TEMPLATE, _image_processor_class

    out = root / f"vla_{shape}_{image_size}"
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_char_tokenizer(out, words=WORDS, special=VISION_TOKENS, chat_template=VL_CHAT_TEMPLATE)
    pixels = image_size * image_size
    _image_processor_class()(
        patch_size=14, merge_size=2, min_pixels=pixels, max_pixels=pixels
    ).save_pretrained(str(out))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(V.vl_config(shape, tokenizer), dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def task_rows(n: int, args: argparse.Namespace, seed: int = 0) -> list[dict[str, Any]]:
    """n Pusher episodes in pixels (the frame is the whole observation), each from its own seed."""
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt": f"{TASK} from seed {s}",
            "env": "gym",
            "gym_id": TASK,
            "seed": int(s),
            "max_steps": args.max_steps,
            "bins": BINS,
            "pixels_only": True,
            "success_return": args.success_return,
        }
        for s in rng.choice(1_000_000, size=n, replace=False)
    ]


def sim_throughput(args: argparse.Namespace) -> dict[str, float]:
    """Random action words through HostedSimEnvs in host processes -> environment steps per second."""
    from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
    from ascent.envs.sim import HostedSimEnvs

    rows = task_rows(args.episodes, args, seed=1)
    hosts = ProcessHosts(args.workers, IsolationPolicy("environment", 300, "rollout.env_timeout_s"))
    rng = np.random.default_rng(0)
    try:
        envs = HostedSimEnvs(hosts, args.copies)
        start = time.perf_counter()
        envs.reset(rows)
        reset_s = time.perf_counter() - start
        live, steps, start = list(range(len(rows))), 0, time.perf_counter()
        while live:
            calls = [(i, "".join(f"<a{k}>" for k in rng.integers(0, BINS, DIMS))) for i in live]
            out = envs.step(calls)
            steps += len(calls)
            live = [i for (i, _), r in zip(calls, out, strict=True) if not isinstance(r, str) and not r.done]
        step_s = time.perf_counter() - start
        envs.close()
    finally:
        hosts.close()
    res = {"episodes": len(rows), "steps": steps, "reset_s": reset_s, "step_s": step_s}
    res["env_steps_per_s"] = steps / step_s
    print(f"simulators: {json.dumps({k: round(v, 3) for k, v in res.items()})}", flush=True)
    return res


class EngineClock:
    """Times every `generate` call of this process's engine (the inline backend's `ReferenceEngine` or
    `FastEngine`), grouped by iteration (`ascent.orchestrator.loop.run_iteration` wrapped): one call per turn
    of the batch's live episodes, so a call's time is the policy's forward for one environment step of the
    whole batch."""

    def __init__(self) -> None:
        from ascent.rollout.fast.engine import FastEngine
        from ascent.rollout.reference import ReferenceEngine

        self.calls: list[tuple[int, float]] = []  # (requests, seconds)
        for cls in (ReferenceEngine, FastEngine):
            cls.generate = self._timed(cls.generate)  # type: ignore[method-assign]
        self.per_iteration: list[list[tuple[int, float]]] = []
        from ascent.orchestrator import loop

        iteration = loop.run_iteration

        def marked(*a: Any, **kw: Any) -> Any:
            self.calls = []
            try:
                return iteration(*a, **kw)
            finally:
                self.per_iteration.append(self.calls)

        loop.run_iteration = marked

    def _timed(self, original: Any) -> Any:
        def timed(engine: Any, requests: list[Any]) -> Any:
            start = time.perf_counter()
            out = original(engine, requests)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.calls.append((len(requests), time.perf_counter() - start))
            return out

        return timed


def run_config(
    args: argparse.Namespace, model: Path, rows: Path, run_dir: Path, ids: list[int]
) -> dict[str, Any]:
    total = args.prompts * args.samples
    return {
        "run_dir": str(run_dir),
        "iterations": args.warmup + args.iterations,
        "seed": 0,
        "val_every": 0,
        "model": {
            "path": str(model),
            "dtype": "bf16" if args.device == "cuda" else "fp32",
            "gradient_checkpointing": True,
        },
        "data": {"train_path": str(rows), "max_prompt_tokens": 512},
        "rollout": {
            "engine": args.engine,
            "source": {
                "name": "env",
                "env": "gym",
                "max_turns": args.max_steps,
                "max_episode_tokens": args.max_steps * (DIMS + args.image_tokens + 64),
                "sims_per_worker": args.copies,
            },
            "env_isolation": "process",
            "env_workers": args.workers,
            "max_new_tokens": DIMS,
            "action_token_ids": ids,
            "prompts_per_step": args.prompts,
            "samples_per_prompt": args.samples,
            "temperature": 1.0,
            "generation_batch_size": total,
        },
        "algorithm": {"advantage": "grpo", "policy_loss": "ppo", "loss_aggregation": "token-mean"},
        "train": {
            "lr": 1e-6,
            "trajectories_per_update": total,
            "epochs_per_rollout": 1,
            "max_tokens_per_micro_batch": args.micro_batch_tokens,
        },
        "cluster": {"device": args.device, "backend": "inline", "placement": "colocated"},
        "checkpoint": {"save_optimizer": False},  # a 3B run's optimizer state is ~30 GB of the machine's disk
        "tracking": {"tensorboard": False, "progress": False},
    }


def summarize(rows: list[dict[str, Any]], clock: list[list[tuple[int, float]]], episodes: int) -> list[dict]:
    """Each iteration's phases, return, success, steps per second over its rollout and policy ms per step."""
    out = []
    for k, r in enumerate(rows):
        calls = clock[k] if k < len(clock) else []
        steps = episodes * r.get("env/episode_length", 0.0)
        policy_s = sum(t for _, t in calls)
        it = {p: round(r.get(f"time/{p}", 0.0), 3) for p in PHASES} | {
            "iteration": round(r["time/iteration"], 3),
            "return": round(r.get("reward/mean", float("nan")), 3),
            "success_rate": round(r.get("env/success_rate", float("nan")), 3),
            "episode_length": round(r.get("env/episode_length", float("nan")), 2),
            "env_steps_per_s": round(steps / max(r.get("time/generate", 0.0), 1e-9), 2),
            "policy_calls": len(calls),
            "policy_ms_per_step": round(1e3 * policy_s / max(len(calls), 1), 1),
            "rollout_outside_policy_s": round(r.get("time/generate", 0.0) - policy_s, 3),
        }
        out.append(it)
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(V.TEXT), default="3b")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--engine", choices=["reference", "fast"], default="reference", help="rollout.engine")
    ap.add_argument("--prompts", type=int, default=8, help="initial states per iteration (GRPO groups)")
    ap.add_argument("--samples", type=int, default=8, help="episodes per initial state")
    ap.add_argument("--max-steps", type=int, default=16, help="simulator steps per episode")
    ap.add_argument("--episodes", type=int, default=64, help="episodes of the simulator-only measurement")
    ap.add_argument("--copies", type=int, default=8, help="simulator copies a worker steps together")
    ap.add_argument("--workers", type=int, default=8, help="simulator worker processes")
    ap.add_argument("--sim-scale", default="", help="EPISODES:COPIES:WORKERS, the simulators alone again")
    ap.add_argument("--image-size", type=int, default=224, help="frames resized to this square (64 tokens)")
    ap.add_argument("--success-return", type=float, default=-22.0)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--root", type=Path, default=Path("/tmp/ascent_embodied"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="config overrides for ascent train (key=value)")
    args = ap.parse_args(argv)
    args.image_tokens = (args.image_size // 28) ** 2
    return args


def train(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """GRPO through `ascent train` in this process; -> per-iteration figures and the peak GPU memory."""
    from transformers import AutoTokenizer

    from ascent.cli import main as ascent_main

    ids = AutoTokenizer.from_pretrained(str(model)).convert_tokens_to_ids(WORDS)
    rows = args.root / "pusher_rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in task_rows(4 * args.prompts, args)))
    run_dir = args.root / f"run_{args.shape}_{args.engine}_{int(time.time())}"
    config = args.root / "embodied.yaml"
    config.write_text(yaml.safe_dump(run_config(args, model, rows, run_dir, ids)))
    clock = EngineClock()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        ascent_main(["train", str(config), *args.overrides])
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    done = [r for r in metrics if "time/iteration" in r]
    per_iter = summarize(done, clock.per_iteration, args.prompts * args.samples)
    res: dict[str, Any] = {"per_iteration": per_iter, "metrics": done}
    timed = per_iter[args.warmup :] or per_iter
    res["median"] = {k: statistics.median(it[k] for it in timed) for k in timed[0]}
    if torch.cuda.is_available():
        res["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        res["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    for k, it in enumerate(per_iter):
        print(f"iteration {k + 1}: {json.dumps(it)}", flush=True)
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    os.environ.setdefault("MUJOCO_GL", "egl")
    args = parse(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if torch.cuda.is_available():
        res["device"] = torch.cuda.get_device_name()
    res["simulators"] = sim_throughput(args)
    if args.sim_scale:  # the simulators alone at a larger batch: how stepping scales past the run's size
        episodes, copies, workers = (int(x) for x in args.sim_scale.split(":"))
        wide = argparse.Namespace(**(vars(args) | dict(episodes=episodes, copies=copies, workers=workers)))
        res["simulators_scaled"] = sim_throughput(wide)
    start = time.perf_counter()
    model = make_checkpoint(args.root, args.shape, args.image_size, args.device)
    res["checkpoint_s"] = time.perf_counter() - start
    res["train"] = train(args, model)
    summary = {"env_steps_per_s_sim_only": res["simulators"]["env_steps_per_s"]} | res["train"]["median"]
    summary["peak_allocated_gib"] = res["train"].get("peak_allocated_gib", 0.0)
    print(
        f"embodied VLA {args.shape} {args.engine} (median after warm-up): {json.dumps(summary)}", flush=True
    )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
