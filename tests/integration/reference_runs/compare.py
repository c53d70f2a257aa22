"""Compare a reference run's summary (`record.summarize`) with the stored one: exactly where the computation
is discrete (which rows, which token ids, which masks, which rewards), within a relative tolerance where
float rounding enters (weights, metrics, logprobs, advantages). `python -m
tests.integration.reference_runs.compare A B` prints the largest deviations between two folders of
recordings (the stability study of README.md).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

# discrete: a different value is a different run on any CPU
EXACT_EPISODE_FIELDS = (
    "iteration",
    "group",
    "row_id",
    "status",
    "reward",
    "finish",
    "turns",
    "policy_version",
    "prompt_ids",
    "response_ids",
    "loss_mask",
)
ROUNDED_EPISODE_FIELDS = ("advantage", "sampler_logprobs")
WEIGHT_STATS = ("sum", "abs_sum", "abs_max", "values")
# Tensors whose gradient is zero but for rounding: attention is invariant to a key bias (it adds the same q.b
# to every score of a query). Adam turns that noise into steps of up to lr, so their values differ between
# ISAs by far more than anything else (3e-7 here against 1e-7 between AVX-512 and AVX2, and they grow with
# the noise); only their names and shapes are compared.
ROUNDING_ONLY = ("self_attn.k_proj.bias",)


def deviations(ref: dict[str, Any], got: dict[str, Any]) -> tuple[list[str], dict[str, float]]:
    """(discrete differences, each as a sentence; the largest deviation per rounded category).

    A weight's deviation is absolute, per element (a tensor's sum and abs-sum over its element count): the
    weights are O(0.01) to O(1), and a relative one would magnify the last bits of the tensors that start at
    zero (biases). A metric's, logprob's or advantage's is |a - b| / max(|reference|, 1)."""
    diffs: list[str] = []
    spread = {"weights": 0.0, "metrics": 0.0, "episodes": 0.0}
    for key in ("weights", "critic_weights"):
        if key in ref or key in got:
            worst = _weights(ref.get(key, {}), got.get(key, {}), diffs, key)
            spread["weights"] = max(spread["weights"], worst)
    spread["metrics"] = _metrics(ref["metrics"], got["metrics"], diffs)
    if "episodes" in ref or "episodes" in got:
        spread["episodes"] = _episodes(ref.get("episodes", []), got.get("episodes", []), diffs)
    return diffs, spread


def _weights(ref: dict[str, Any], got: dict[str, Any], diffs: list[str], key: str) -> float:
    if sorted(ref) != sorted(got):
        diffs.append(f"{key}: tensors {sorted(set(ref) ^ set(got))} in one run only")
    worst = 0.0
    for name in sorted(set(ref) & set(got)):
        a, b = ref[name], got[name]
        if (a["shape"], a["dtype"]) != (b["shape"], b["dtype"]):
            diffs.append(f"{key}.{name}: {a['shape']} {a['dtype']} != {b['shape']} {b['dtype']}")
            continue
        if name.endswith(ROUNDING_ONLY):
            continue
        numel = math.prod(a["shape"])
        for stat in WEIGHT_STATS:
            per_element = numel if stat in ("sum", "abs_sum") else 1  # a sum's deviation as its mean's
            xs, ys = _floats(a[stat]), _floats(b[stat])
            worst = max(worst, *(abs(x - y) / per_element for x, y in zip(xs, ys, strict=True)))
    return worst


def _metrics(ref: list[dict[str, Any]], got: list[dict[str, Any]], diffs: list[str]) -> float:
    if len(ref) != len(got):
        diffs.append(f"metrics: {len(ref)} lines != {len(got)}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(ref, got, strict=False)):
        if sorted(a) != sorted(b):
            diffs.append(f"metrics line {i}: keys {sorted(set(a) ^ set(b))} in one run only")
        for k in sorted(set(a) & set(b)):
            worst = max(worst, _relative(a[k], b[k]))
    return worst


def _episodes(ref: list[dict[str, Any]], got: list[dict[str, Any]], diffs: list[str]) -> float:
    if len(ref) != len(got):
        diffs.append(f"episodes: {len(ref)} != {len(got)}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(ref, got, strict=False)):
        for f in EXACT_EPISODE_FIELDS:
            if a[f] != b[f]:
                diffs.append(f"episode {i} (iteration {a['iteration']}): {f} {a[f]} != {b[f]}")
        for f in ROUNDED_EPISODE_FIELDS:
            xs, ys = _floats(a[f]), _floats(b[f])
            if len(xs) != len(ys):
                diffs.append(f"episode {i}: {f} has {len(xs)} values, not {len(ys)}")
                continue
            worst = max(worst, 0.0, *(_relative(x, y) for x, y in zip(xs, ys, strict=True)))
    return worst


def _floats(value: Any) -> list[float]:
    if value is None:
        return []
    return [float(v) for v in value] if isinstance(value, list) else [float(value)]


def _relative(a: Any, b: Any) -> float:
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return 0.0 if a == b else float("inf")
    return abs(float(a) - float(b)) / max(abs(float(a)), 1.0)


def main() -> None:
    """Print, per kind, the discrete differences and the largest deviations between two recording folders."""
    first, second = Path(sys.argv[1]), Path(sys.argv[2])
    for path in sorted(p for p in first.glob("*.json") if (second / p.name).exists()):
        diffs, spread = deviations(json.loads(path.read_text()), json.loads((second / path.name).read_text()))
        worst = "  ".join(f"{k} {v:.2e}" for k, v in spread.items())
        print(f"{path.stem:7s} discrete differences: {len(diffs):3d}  largest relative: {worst}")
        for line in diffs[:5]:
            print("    " + line)


if __name__ == "__main__":
    main()
