"""What is alive at the peak of a CUDA allocator snapshot (`bench/e2e.py --memory-snapshot PATH`).

    python bench/memory_peak.py snapshot.pickle [--top 25]

Replays the recorded alloc/free events, finds the moment the traced allocations peak, and groups the blocks
alive then by the innermost frame in ascent/, transformers/ or torch/ code that allocated them. Memory
allocated before recording started (weights, gradients' storage kept by the optimizer, AdamW moments) is
reported as one line from the `.base` file the bench writes next to the snapshot.
"""

from __future__ import annotations

import argparse
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

GIB = 2**30
KEEP = ("ascent/", "transformers/", "torch/")


def where(frames: list[dict[str, Any]]) -> str:
    """The first frame (innermost first) inside the packages we care about, as file:line function."""
    for f in frames:
        name = f.get("filename", "")
        for key in KEEP:
            if key in name and "torch/cuda/memory" not in name and "torch/utils/_python" not in name:
                short = name[name.index(key) :]
                return f"{short}:{f.get('line')} {f.get('name')}"
    return "(no python frame)"


def peak_blocks(trace: list[dict[str, Any]]) -> tuple[int, dict[int, tuple[int, str]], int]:
    """events -> (peak bytes over the trace start, blocks alive at the peak {addr: (size, where)}, index)."""
    live: dict[int, tuple[int, str]] = {}
    total = best = best_i = 0
    best_live: dict[int, tuple[int, str]] = {}
    for i, ev in enumerate(trace):
        action, addr, size = ev["action"], ev["addr"], ev["size"]
        if action == "alloc":
            live[addr] = (size, where(ev.get("frames", [])))
            total += size
            if total > best:
                best, best_i, best_live = total, i, dict(live)
        elif action in ("free_completed",) and addr in live:
            total -= live.pop(addr)[0]
    return best, best_live, best_i


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    snap = pickle.loads(args.snapshot.read_bytes())
    trace = [ev for dev in snap["device_traces"] for ev in dev]
    base_file = args.snapshot.with_suffix(".base")
    base = int(base_file.read_text()) if base_file.exists() else 0
    peak, live, index = peak_blocks(trace)
    print(f"allocated before recording: {base / GIB:.2f} GiB")
    print(
        f"traced peak: {peak / GIB:.2f} GiB at event {index} of {len(trace)} -> total "
        f"{(base + peak) / GIB:.2f} GiB"
    )
    groups: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for size, site in live.values():
        groups[site] += size
        counts[site] += 1
    for site, size in groups.most_common(args.top):
        print(f"{size / GIB:8.3f} GiB  {counts[site]:5d} blocks  {site}")


if __name__ == "__main__":
    main()
