"""The arithmetic demo, end to end: tiny model -> data -> SFT warm-start -> GRPO -> held-out accuracy.

Every step runs the real `ascent` CLI (the commands are printed), so this file doubles as a walkthrough:

    python examples/arithmetic/run_demo.py            # about 3-5 minutes on a 2-core CPU

It ends by printing held-out accuracy (greedy decoding, exact match) before and after RL.
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
DEFAULT_ROOT = "runs/arithmetic"


def paths(root: Path) -> dict[str, Path]:
    """What the demo writes under `root` (the README's "Using it" commands read these paths): the tiny model,
    the data (sft/train/val.jsonl), the SFT run (its weights in `final/`) and the GRPO run."""
    return {name: root / name for name in ("base", "data", "sft", "grpo")}


def sh(*args: str) -> None:
    """Run one `ascent` command in a subprocess, echoing it first; stop the demo if it fails."""
    cmd = [sys.executable, "-m", "ascent", *args]
    print(f"\n$ ascent {shlex.join(args)}", flush=True)
    if subprocess.call(cmd) != 0:
        sys.exit(f"demo step failed: ascent {shlex.join(args)}")


def evaluate(model: str, data: str, out: str) -> float:
    sh(
        "eval",
        "--model",
        model,
        "--data",
        data,
        "--reward",
        "exact_match",
        "--max-new-tokens",
        "8",
        "--out",
        out,
    )
    rows = [json.loads(line) for line in Path(out).read_text().splitlines()]
    return sum(r["reward"] >= 1.0 for r in rows) / len(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=DEFAULT_ROOT, help="where the model, data and runs go")
    p.add_argument("--iterations", type=int, default=None, help="override the GRPO iterations")
    a = p.parse_args()
    root = Path(a.root)
    at = paths(root)
    t0 = time.time()
    for old in ("sft", "grpo"):  # a second demo run starts over (train refuses to overwrite checkpoints)
        if at[old].exists():
            print(f"   removing the previous demo run {at[old]}")
            shutil.rmtree(at[old])
    sys.path.insert(0, str(HERE))
    from make_data import make

    from ascent.models.tiny import make_tiny_checkpoint

    print("1. a tiny Qwen2-architecture model and a character tokenizer, written like a real checkpoint")
    make_tiny_checkpoint(at["base"], hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, seed=0)
    data = make(at["data"], digits=2, sft=2000, train=4000, val=200, seed=0)
    print(f"   model: {at['base']}   data: {data}")
    over = [f"run_dir={at['sft']}", f"model.path={at['base']}", f"data.train_path={data / 'sft.jsonl'}"]
    print("2. supervised warm-start (SFT), stopped early on purpose")
    sh("sft", str(HERE / "sft.yaml"), *over)
    before = evaluate(str(at["sft"] / "final"), str(data / "val.jsonl"), str(root / "eval_before.jsonl"))
    print("3. GRPO with an exact-match reward")
    over = [
        f"run_dir={at['grpo']}",
        f"model.path={at['sft'] / 'final'}",
        f"data.train_path={data / 'train.jsonl'}",
        f"data.val_path={data / 'val.jsonl'}",
    ] + ([f"iterations={a.iterations}"] if a.iterations else [])
    sh("train", str(HERE / "grpo.yaml"), *over)
    ckpts = sorted((at["grpo"] / "checkpoints").glob("iter_*"))
    after = evaluate(str(ckpts[-1]), str(data / "val.jsonl"), str(root / "eval_after.jsonl"))
    print(
        f"\nheld-out accuracy (200 unseen problems, greedy): before RL {before:.1%}  ->  after RL {after:.1%}"
    )
    print(f"total time {time.time() - t0:.0f}s; curves: tensorboard --logdir {at['grpo'] / 'tensorboard'}")


if __name__ == "__main__":
    main()
