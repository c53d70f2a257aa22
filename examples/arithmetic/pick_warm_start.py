"""Pick the SFT checkpoint GRPO starts from in the GPU learning run (examples/arithmetic/run_gpu.sh).

The SFT loss of the 13M-parameter model sits on a plateau (held-out accuracy under 10%) and then drops
sharply, within ~200 optimizer steps, to ~90% accuracy; where that drop happens varies with the data order
and the GPU's numerics (steps ~1000-2000 measured). A fixed SFT length therefore leaves GRPO either almost
no reward to find or almost nothing left to learn. This script walks the SFT checkpoints in order, scores
each greedily on prompts of the RL *training* set (the held-out set stays untouched), and prints the path of
the first one at or above --min-accuracy (the final weights if none is).

    python3 examples/arithmetic/pick_warm_start.py --sft runs/arithmetic_gpu/sft \
        --data runs/arithmetic_gpu/data/train.jsonl --min-accuracy 0.25
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft", required=True, help="The SFT run_dir (with checkpoints/ and final/).")
    p.add_argument("--data", required=True, help="Prompts with answers to score on (not the held-out set).")
    p.add_argument("--min-accuracy", type=float, default=0.25)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=8)
    a = p.parse_args()

    from ascent.entrypoints.evaluate import run_eval
    from ascent.orchestrator import checkpointing

    run_dir = Path(a.sft)
    candidates = [*checkpointing.checkpoint_dirs(run_dir), run_dir / "final"]
    for path in candidates:
        metrics = run_eval(
            model=str(path), data=a.data, max_new_tokens=a.max_new_tokens, max_prompts=a.prompts
        )
        print(
            f"{path.name}: accuracy {metrics['accuracy']:.3f} on {a.prompts} training prompts",
            file=sys.stderr,
        )
        if metrics["accuracy"] >= a.min_accuracy:
            break
    print(path)


if __name__ == "__main__":
    main()
