"""Does GRPO with the zoom tool beat the same model without it, and its own start? (issue #28)

    python examples/vision/run_comparison.py                 # CPU, 3 seeds (timings in README.md)
    python examples/vision/run_comparison.py --seeds 1 --iterations 5   # a quick look

Steps, each a real CLI call (echoed): write a tiny Qwen2.5-VL checkpoint and the zoom task (`make_setup.py`:
224 px images, 8 px details, 16 image tokens per image, so a detail is readable only zoomed), SFT on 64
zoom-then-answer demonstrations (`sft.yaml`), then per seed two GRPO runs from that same start
(`grpo.yaml`): WITH the tool (`zoom_qa`) and WITHOUT it (`image_qa`, the same questions, one look). Each run
validates greedily on 32 held-out questions at its start and at its end; the table is those accuracies.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sh(*args: str) -> None:
    """Run one `ascent` command, echoing it; stop if it fails."""
    print(f"$ ascent {shlex.join(args)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "ascent", *args], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(proc.stdout)
        sys.exit(f"step failed: ascent {shlex.join(args)}")


def greedy_accuracy(run_dir: Path) -> tuple[float, float]:
    """A run's held-out greedy accuracy at its start and at its end (metrics.jsonl)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    acc = [m["val/accuracy"] for m in map(json.loads, lines) if "val/accuracy" in m]
    return acc[0], acc[-1]


def grpo(root: Path, arm: str, seed: int, extra: list[str]) -> tuple[float, float]:
    """One GRPO run of `arm` (`zoom`: zoom_qa rows; `plain`: image_qa rows) from the SFT start."""
    run = root / f"grpo_{arm}_{seed}"
    shutil.rmtree(run, ignore_errors=True)
    env = "zoom_qa" if arm == "zoom" else "image_qa"
    sh(
        "train",
        str(HERE / "grpo.yaml"),
        f"run_dir={run}",
        f"seed={seed}",
        f"model.path={root / 'sft' / 'final'}",
        f"data.train_path={root / arm / 'rows.jsonl'}",
        f"data.val_path={root / arm / 'val.jsonl'}",
        f"rollout.source.env={env}",
        *extra,
    )
    return greedy_accuracy(run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("runs/vision"), help="where model, data and runs go")
    p.add_argument("--seeds", type=int, default=3, help="GRPO seeds per arm (default 3)")
    p.add_argument("--iterations", type=int, default=None, help="override grpo.yaml's iterations")
    p.add_argument("--sft-epochs", type=float, default=None, help="override sft.yaml's epochs")
    p.add_argument("--rows", type=int, default=64, help="training questions (and SFT demonstrations)")
    p.add_argument("--val", type=int, default=32, help="held-out questions")
    a = p.parse_args()
    sys.path.insert(0, str(HERE))
    from make_setup import make_setup

    t0 = time.time()
    shutil.rmtree(a.root / "sft", ignore_errors=True)
    make_setup(a.root, a.rows, n_val=a.val)
    over = [f"model.path={a.root / 'model'}", f"data.train_path={a.root / 'zoom' / 'sft.jsonl'}"]
    epochs = [f"epochs={a.sft_epochs}"] if a.sft_epochs else []
    sh("sft", str(HERE / "sft.yaml"), f"run_dir={a.root / 'sft'}", *over, *epochs)
    t_sft = time.time() - t0
    extra = [f"iterations={a.iterations}"] if a.iterations else []
    results, times = [], []
    for seed in range(1, a.seeds + 1):
        t1 = time.time()
        results.append((seed, grpo(a.root, "zoom", seed, extra), grpo(a.root, "plain", seed, extra)))
        times.append(time.time() - t1)
    print(f"\nheld-out greedy accuracy ({a.val} questions); setup + SFT {t_sft:.0f}s")
    print("seed | with tool: start -> GRPO | without tool: start -> GRPO | both arms' wall time")
    for (seed, (z0, z1), (p0, p1)), t in zip(results, times, strict=True):
        print(f"{seed:4d} | {z0:10.3f} -> {z1:.3f}       | {p0:13.3f} -> {p1:.3f}          | {t:.0f}s")
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
