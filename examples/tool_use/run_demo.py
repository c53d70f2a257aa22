"""The tool-use demo, end to end: a tiny model learns to multiply through the Python tool.

    python examples/tool_use/run_demo.py                    # CPU: about 25 minutes on 2 cores
    python examples/tool_use/run_demo.py --scale gpu        # one GPU, about 11 minutes: a 6M model, more data

A 1M-parameter model cannot multiply a three-digit number by a two-digit one in its head. Here it is given
the built-in `python_math` environment: it may call a sandboxed Python interpreter in Qwen's `<tool_call>`
format, reads the tool's answer, then answers. Steps, each a real CLI call (echoed): write the model and the
data (`make_data.py`: the SFT demonstrations are played through the environment itself), SFT on the
demonstrations (`ascent sft` on whole conversations, loss on the model's turns only), held-out accuracy,
GRPO on episodes (`ascent train` with `rollout.source={name: env, env: python_math}`), held-out accuracy
again. Accuracy is reported greedy and at temperature 1 (what RL samples); after SFT the greedy answer is
mostly right but a sampled episode rarely is (every one of ~60 tokens of the call must be right), and RL
closes that gap.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCALES = {  # model shape, data sizes, SFT epochs and GRPO settings per scale
    "cpu": {
        "model": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2),
        "sft": 500,
        "train": 4000,
        "epochs": 12.0,
        "grpo": [],
        "sft_extra": [],
    },
    "gpu": {
        "model": dict(hidden_size=256, num_layers=6, num_heads=4, num_kv_heads=2),
        "sft": 2000,
        "train": 20000,
        "epochs": 8.0,
        "grpo": [
            "cluster.device=cuda",
            "rollout.prompts_per_step=64",
            "rollout.generation_batch_size=512",
            "train.trajectories_per_update=256",
            "train.lr=2e-4",
            "iterations=25",
            "rollout.env_workers=12",
            "train.compile=off",
        ],
        "sft_extra": ["train.compile=off"],
    },  # 6M parameters: compiling costs more than it saves
}


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    """Run one `ascent` command, echoing it; stop the demo if it fails."""
    print(f"\n$ ascent {shlex.join(args)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "ascent", *args], stdout=subprocess.PIPE, text=True)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        sys.exit(f"demo step failed: ascent {shlex.join(args)}")
    return proc


def accuracy(model: Path, data: Path, device: str, temperature: float, samples: int) -> float:
    proc = sh(
        "eval",
        "--model",
        str(model),
        "--data",
        str(data),
        "--env",
        "python_math",
        "--max-turns",
        "3",
        "--max-new-tokens",
        "80",
        "--max-episode-tokens",
        "128",
        "--device",
        device,
        "--temperature",
        str(temperature),
        "--samples",
        str(samples),
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("accuracy:"))
    return float(line.split(":")[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=None, help="where the model, data and runs go (runs/tool_use[_gpu])")
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--iterations", type=int, default=None, help="override the GRPO iterations")
    a = p.parse_args()
    s = SCALES[a.scale]
    root = Path(a.root or ("runs/tool_use" if a.scale == "cpu" else "runs/tool_use_gpu"))
    device = "cuda" if a.scale == "gpu" else "cpu"
    t0 = time.time()
    for old in ("sft", "grpo"):  # a second demo run starts over (train refuses to overwrite checkpoints)
        shutil.rmtree(root / old, ignore_errors=True)
    sys.path.insert(0, str(HERE))
    from make_data import make

    from ascent.models.tiny import DEFAULT_CHARS, make_tiny_checkpoint

    print("1. a tiny Qwen2-architecture model whose tokenizer has Qwen's <tool_call> tokens, and the data")
    make_tiny_checkpoint(
        root / "base", chars=DEFAULT_CHARS + "{}", words=["<tool_call>", "</tool_call>"], seed=0, **s["model"]
    )
    data = make(root / "data", sft=s["sft"], train=s["train"], val=200, seed=0)
    print("2. SFT on tool-use conversations (loss on the model's turns only)")
    sh(
        "sft",
        str(HERE / "sft.yaml"),
        f"run_dir={root / 'sft'}",
        f"model.path={root / 'base'}",
        f"data.train_path={data / 'sft.jsonl'}",
        f"epochs={s['epochs']}",
        *s["sft_extra"],
    )
    warm = root / "sft" / "final"
    before = (
        accuracy(warm, data / "val.jsonl", device, 0.0, 1),
        accuracy(warm, data / "val.jsonl", device, 1.0, 2),
    )
    print("3. GRPO on python_math episodes")
    over = [
        f"run_dir={root / 'grpo'}",
        f"model.path={warm}",
        f"data.train_path={data / 'train.jsonl'}",
        f"data.val_path={data / 'val.jsonl'}",
        "tracking.progress=false",
        *s["grpo"],
    ]
    sh("train", str(HERE / "grpo.yaml"), *over, *([f"iterations={a.iterations}"] if a.iterations else []))
    final = sorted((root / "grpo" / "checkpoints").glob("iter_*"))[-1]
    after = (
        accuracy(final, data / "val.jsonl", device, 0.0, 1),
        accuracy(final, data / "val.jsonl", device, 1.0, 2),
    )
    print(
        f"\nheld-out accuracy (200 unseen problems): greedy {before[0]:.1%} -> {after[0]:.1%}; "
        f"sampled at temperature 1 (2 per problem) {before[1]:.1%} -> {after[1]:.1%}"
    )
    print(f"total time {time.time() - t0:.0f}s; episodes: ascent episodes {root / 'grpo'}")


if __name__ == "__main__":
    main()
