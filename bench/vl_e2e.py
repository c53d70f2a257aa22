"""Vision-language GRPO iteration benchmark: `ascent train` on a Qwen2.5-VL shape, timed by phase.

    python bench/vl_e2e.py --shape 3b --json vl_3b.json        # --shape tiny --device cpu: a CPU check

Runs the real CLI in this process (`cluster.backend=inline`, colocated, bf16, `--engine` fast (default: the
vision tower once per distinct image, multimodal RoPE, CUDA graphs for decode) or reference) on bench/vl_workload.py's workload: `--prompts` rows x `--samples`
samples, one `--image-size` image per row (448 px: 256 image tokens), exactly `--new-tokens` new tokens at
most, a coin-flip reward. Reads each iteration's phase times (`time/*`) from the run's metrics.jsonl and
reports the median over the iterations after `--warmup`, images per second through the update (the
samples' images are scored by the trainer twice: old logprobs and the update) and the process's peak GPU
memory. Same workload as bench/trl_vl_baseline.py, for a same-call comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vl_workload as V  # noqa: E402

PHASES = ("generate", "reward", "logprobs", "advantages", "update", "publish")


def run_config(args: argparse.Namespace, model: Path, rows: Path, run_dir: Path) -> dict[str, Any]:
    total = args.prompts * args.samples
    return {
        "run_dir": str(run_dir),
        "iterations": args.warmup + args.iterations,
        "seed": 0,
        "model": {
            "path": str(model),
            "dtype": "bf16" if args.device == "cuda" else "fp32",
            "gradient_checkpointing": True,  # as TRL's default
        },
        "data": {"train_path": str(rows), "max_prompt_tokens": args.image_tokens + 64},
        "rollout": {
            "engine": args.engine,
            "prompts_per_step": args.prompts,
            "samples_per_prompt": args.samples,
            "max_new_tokens": args.new_tokens,
            "generation_batch_size": total,
        },
        "reward": {"fn": "vl_workload:coin_reward", "isolation": "inline"},
        "train": {
            "lr": 1e-6,
            "trajectories_per_update": total,
            "max_tokens_per_micro_batch": args.micro_batch_tokens,
        },
        "cluster": {"device": args.device, "backend": "inline", "placement": "colocated"},
        "tracking": {"tensorboard": False, "progress": False},
    }


def iterations(run_dir: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "time/iteration" in r]


def summarize(rows: list[dict[str, float]], args: argparse.Namespace) -> dict[str, float]:
    med = {p: statistics.median(r.get(f"time/{p}", 0.0) for r in rows) for p in PHASES}
    med["iteration"] = statistics.median(r["time/iteration"] for r in rows)
    total = args.prompts * args.samples
    med["completions_per_s"] = total / med["iteration"]
    med["images_per_s_generate"] = total / max(med["generate"], 1e-9)
    med["images_per_s_update"] = total / max(med["update"], 1e-9)
    return med


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(V.TEXT), default="3b")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--engine", choices=["fast", "reference"], default="fast")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch-tokens", type=int, default=8192)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--root", type=Path, default=Path("/tmp/ascent_vl"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="config overrides for ascent train (key=value)")
    args = ap.parse_args(argv)
    args.image_tokens = (args.image_size // 28) ** 2
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from ascent.cli import main as ascent_main

    args = parse(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    model = V.make_checkpoint(args.root, args.shape, args.image_size, args.device)
    rows = V.write_rows(args.root, max(4 * args.prompts, 64), args.image_size)
    run_dir = args.root / f"run_{args.shape}_{int(time.time())}"
    config = args.root / "vl_e2e.yaml"
    config.write_text(yaml.safe_dump(run_config(args, model, rows, run_dir)))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        ascent_main(["train", str(config), *args.overrides])
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    rows_done = iterations(run_dir)
    res: dict[str, Any] = V.W.report_header(args)
    res["iterations"] = rows_done
    res["median"] = summarize(rows_done[args.warmup :] or rows_done, args)
    if torch.cuda.is_available():
        res["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(
        f"ascent VL {args.shape}: " + json.dumps({k: round(v, 3) for k, v in res["median"].items()}),
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
