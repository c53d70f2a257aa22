"""How long the trainer waits for the replicas, with and without weight swaps between decode steps.

    python bench/swap_wait.py --device cuda --out $OUT/swap.json      # 2 GPUs: one trainer, one replica
    python bench/swap_wait.py --device cuda --gpus-per-worker 0.5     # both on one GPU (CUDA IPC)
    python bench/swap_wait.py --device cpu --out /tmp/swap_cpu.json   # a local Ray cluster on CPUs, ~1 min

Runs the same async `ascent train` twice (`rollout.max_staleness=1`, `cluster.backend=ray`,
`cluster.placement=split`, the fast engine: the replica generates iteration i+1 while the trainer updates on
iteration i), once with `rollout.swap_mid_generation=continue` (a publication lands between two decode steps
of the generate call in flight) and once with `off` (it waits for the call to end). The model is a random
tiny Qwen2 (`ascent.models.tiny`, --hidden/--layers) or --model; responses are long (--max-new-tokens) because
a random model rarely stops, which is the case the swap is for. Per run and iteration (the first is left
out: nothing overlaps before the first publication) it reports `time/publish` (the trainer waiting for the
replicas to take its weights), `time/trainer_idle` (waiting for generation), `time/iteration` and
`rollout/swapped_sequences`, and their sum "trainer wait"; --out gets every logged metric of both runs as
JSON.

What to expect: `time/publish` drops to about one decode step with the swap. At --staleness 1 the trainer
needs the batch being generated next anyway, so much of that wait moves to `time/trainer_idle`; what the swap
buys there is fresher tokens (the rest of that batch is sampled with the new weights) and a trainer free for
logging, validation or a checkpoint meanwhile. With --staleness k >= 2 a publication without the swap waits
for every batch queued before it, so the whole wait shrinks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("time/publish", "time/trainer_idle", "time/iteration", "rollout/swapped_sequences")
MODES = ("continue", "off")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--workdir", type=Path, default=Path("runs/bench_swap"))
    p.add_argument("--model", type=Path, help="A checkpoint to use instead of a random tiny one.")
    p.add_argument("--hidden", type=int, default=64, help="Hidden size of the random tiny model.")
    p.add_argument("--layers", type=int, default=2, help="Layers of the random tiny model.")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument(
        "--staleness", type=int, default=1, help="rollout.max_staleness (batches generated ahead)."
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="Default: 160 on CPU, 1024 on CUDA.")
    p.add_argument("--prompts", type=int, default=4, help="rollout.prompts_per_step (x 8 samples).")
    p.add_argument("--timeout", type=float, default=1800.0, help="Seconds one `ascent train` run may take.")
    p.add_argument("--out", type=Path, help="Write both runs' metrics here as JSON.")
    p.add_argument(
        "--gpus-per-worker",
        type=float,
        default=1.0,
        help="On CUDA: 1 puts trainer and replica on GPUs of their own; 0.5 shares one GPU.",
    )
    return p.parse_args(argv)


def inputs(args: argparse.Namespace) -> tuple[Path, Path]:
    """(model directory, data directory), made once in --workdir."""
    sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))
    from make_data import make

    from ascent.models.tiny import make_tiny_checkpoint

    data = args.workdir / "data"
    if not (data / "train.jsonl").exists():
        make(data, digits=2, sft=10, train=400, val=10, seed=0)
    if args.model is not None:
        return args.model, data
    model = args.workdir / f"tiny_h{args.hidden}_l{args.layers}"
    if not (model / "config.json").exists():
        make_tiny_checkpoint(
            model, hidden_size=args.hidden, num_layers=args.layers, max_position_embeddings=2048, seed=0
        )
    return model, data


def config(args: argparse.Namespace, model: Path, data: Path, mode: str) -> dict[str, Any]:
    max_new = args.max_new_tokens or (160 if args.device == "cpu" else 1024)
    cuda = args.device == "cuda"
    return {
        "run_dir": str(args.workdir / f"run_{mode}"),
        "seed": 0,
        "iterations": args.iterations,
        "val_every": 0,
        "model": {"path": str(model), "dtype": "bf16" if cuda else "fp32"},
        "data": {"train_path": str(data / "train.jsonl"), "max_prompt_tokens": 32},
        "rollout": {
            "engine": "fast",
            "prompts_per_step": args.prompts,
            "samples_per_prompt": 8,
            "max_new_tokens": max_new,
            "max_staleness": args.staleness,
            "swap_mid_generation": mode,
        },
        "train": {
            "lr": 1e-5,
            "trajectories_per_update": args.prompts * 8,
            "max_tokens_per_micro_batch": 4 * (max_new + 32),
        },
        "cluster": {
            "backend": "ray",
            "placement": "split",
            "device": args.device,
            "gpus_per_worker": args.gpus_per_worker if cuda else 0,
            "cpus_per_worker": 1 if cuda else 0.5,
        },
        "tracking": {"progress": False},
    }


def run(args: argparse.Namespace, cfg: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """One `ascent train` run -> its metrics.jsonl rows (the run directory is started fresh)."""
    run_dir = Path(cfg["run_dir"])
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    path = args.workdir / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ascent", "train", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=args.timeout,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"swap_mid_generation={mode}: ascent train exited {proc.returncode}\n{proc.stderr[-4000:]}"
        )
    print(f"swap_mid_generation={mode}: {time.perf_counter() - t0:.1f} s", flush=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/publish" in r]


def table(results: dict[str, list[dict[str, Any]]]) -> None:
    """Mean of each key over iterations 2.. per mode, and the trainer's whole wait (publish + idle)."""
    print(f"{'mode':<10}" + "".join(f"{k:>28}" for k in (*KEYS, "trainer wait")))
    for mode, rows in results.items():
        later = rows[1:] or rows
        cells = [statistics.mean(float(r.get(k, 0.0)) for r in later) for k in KEYS]
        print(f"{mode:<10}" + "".join(f"{c:>28.4f}" for c in (*cells, cells[0] + cells[1])))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    model, data = inputs(args)
    results = {}
    for i, mode in enumerate(MODES):
        if i:
            time.sleep(
                10
            )  # the previous run's local Ray cluster is still shutting down: a new one started at
            # once lost its node now and then on the CPU test machine
        results[mode] = run(args, config(args, model, data, mode), mode)
    table(results)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
