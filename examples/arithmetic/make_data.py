"""Synthetic multi-digit addition with a verifiable answer: the data of the arithmetic demo.

Writes three JSONL files into --out: `sft.jsonl` (prompt + response pairs for the warm-start), `train.jsonl`
(prompts + `answer` for RL) and `val.jsonl` (held-out prompts, disjoint from both).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def problems(digits: int, seed: int) -> list[tuple[int, int]]:
    """Every pair of operands below 10**digits, shuffled by seed."""
    hi = 10**digits
    pairs = [(a, b) for a in range(hi) for b in range(hi)]
    random.Random(seed).shuffle(pairs)
    return pairs


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def make(
    out: str | Path, *, digits: int = 2, sft: int = 2000, train: int = 4000, val: int = 200, seed: int = 0
) -> Path:
    """Write sft.jsonl, train.jsonl and val.jsonl into `out`; returns the directory."""
    pairs = problems(digits, seed)
    if sft + train + val > len(pairs):
        raise ValueError(
            f"--sft + --train + --val = {sft + train + val} exceeds the {len(pairs)} distinct problems"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": "addition"} for a, b in pairs]
    write_jsonl(out / "val.jsonl", rows[:val])
    write_jsonl(out / "train.jsonl", rows[val : val + train])
    sft_rows = [
        {"prompt": r["prompt"], "response": r["answer"]} for r in rows[val + train : val + train + sft]
    ]
    write_jsonl(out / "sft.jsonl", sft_rows)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/arithmetic/data")
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--sft", type=int, default=2000)
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--val", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(make(a.out, digits=a.digits, sft=a.sft, train=a.train, val=a.val, seed=a.seed))


if __name__ == "__main__":
    main()
