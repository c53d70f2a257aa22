"""Data for the tool-use example: multiplications a 1M-parameter model cannot do in its head.

Every row asks for a product of a three-digit and a two-digit number (`prompt`, `answer`). The SFT set holds
whole conversations in the built-in `python_math` environment: the model's call of the Python tool in its
native `<tool_call>` format, the tool's answer as the sandbox really printed it, then the final answer. They
are made by playing the environment itself, so a demonstration is token for token an episode RL would
sample.

    python examples/tool_use/make_data.py OUT_DIR [--sft 300] [--train 4000] [--val 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from ascent.envs import make_env

SYSTEM = "Use the python tool."  # short: every character is a token of the tiny model


def problem(rng: random.Random) -> dict[str, Any]:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a}*{b}?"}]
    return {"prompt": prompt, "answer": a * b, "a": a, "b": b}


def call(code: str) -> str:
    """A model turn that calls the Python tool, in the Qwen tool-call format."""
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def demonstration(row: dict[str, Any]) -> dict[str, Any]:
    """The conversation of a perfect episode of `python_math` on `row`, checked by the environment."""
    env = make_env("python_math")
    messages = list(env.reset(row))
    action = call(f"print({row['a']}*{row['b']})")
    result = env.step(action)
    answer = str(result.observation[0]["content"]).strip()
    final = env.step(answer)
    if not (final.done and final.reward == 1.0):
        raise RuntimeError(f"the demonstration for row {row!r} did not earn its reward: {answer!r}")
    messages += [{"role": "assistant", "content": action}, *result.observation]
    return {"messages": [*messages, {"role": "assistant", "content": answer}]}


def make(out: Path, sft: int = 300, train: int = 4000, val: int = 200, seed: int = 0) -> Path:
    """Write sft.jsonl (conversations), train.jsonl and val.jsonl (disjoint problems) under `out`."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    rows: list[dict[str, Any]] = []
    while len(rows) < sft + train + val:
        row = problem(rng)
        if (row["a"], row["b"]) not in seen:
            seen.add((row["a"], row["b"]))
            rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    parts = {"val": rows[:val], "train": rows[val : val + train], "sft": rows[val + train :]}
    for name, part in parts.items():
        lines = [demonstration(r) if name == "sft" else r for r in part]
        (out / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--sft", type=int, default=300)
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--val", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(make(a.out, a.sft, a.train, a.val, a.seed))
