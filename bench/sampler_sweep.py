"""The one-pass Triton sampler's (chunk, block, warps) choices, timed on a decode step's logits.

    python bench/sampler_sweep.py --rows 256 --vocab 151936

fp32 logits [rows, vocab] (what the engine's head hands the sampler: N(0, 2) entries, or with `--peaked`
a few strong ones a row, as a trained model's), temperature 1, seeded noise; each
config is timed with triton.testing.do_bench (median) and checked to draw the same tokens as the default
CONFIG (the noise does not depend on the config, so only the logprob rounding may differ). Prints us per call
and the logits' read bandwidth.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = [
    (c, b, w)
    for c in (4096, 8192, 16384, 32768)
    for b in (256, 512, 1024, 2048)
    for w in (2, 4, 8)
    if b <= c and 32 * w <= b
]


def main(argv: list[str] | None = None) -> list[dict]:
    import triton.testing as tt

    from ascent.rollout.fast import triton_sample as ts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--peaked", action="store_true", help="add a few strong logits a row")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, generator=g, device=dev) * 2
    if args.peaked:  # a trained model's shape: a few strong candidates a row
        top = torch.randint(0, args.vocab, (args.rows, 4), generator=g, device=dev)
        logits.scatter_add_(1, top, torch.tensor([14.0, 12.0, 11.5, 9.0], device=dev).expand(args.rows, 4))
    temp = torch.ones(args.rows, device=dev)
    seeds = torch.arange(args.rows, device=dev, dtype=torch.long) * 7919
    steps = torch.full((args.rows,), 300, device=dev, dtype=torch.long)
    want_t, want_lp = ts.triton_sample(logits, temp, seeds, steps, False)
    rows = []
    for cfg in [ts.CONFIG, *[c for c in CONFIGS if c != ts.CONFIG]]:
        try:
            got_t, got_lp = ts.triton_sample(logits, temp, seeds, steps, False, cfg)
            call = functools.partial(ts.triton_sample, logits, temp, seeds, steps, False, cfg)
            ms = tt.do_bench(call, return_mode="median")
        except Exception as e:  # noqa: BLE001  (a config the compiler refuses: report it, go on)
            print(f"{cfg}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        row = dict(
            config=cfg,
            us=ms * 1e3,
            gbs=logits.numel() * 4 / ms / 1e6,
            same_tokens=bool((got_t == want_t).all()),
            lp_diff=float((got_lp - want_lp).abs().max()),
        )
        rows.append(row)
        print(
            f"chunk {cfg[0]:6d} block {cfg[1]:5d} warps {cfg[2]:2d}: {row['us']:7.1f} us "
            f"{row['gbs']:6.0f} GB/s  same tokens {row['same_tokens']}  lp diff {row['lp_diff']:.1e}"
            + ("  (default)" if cfg == ts.CONFIG else ""),
            flush=True,
        )
    best = min(rows, key=lambda r: r["us"])
    print(f"best {best['config']} {best['us']:.1f} us; default {rows[0]['us']:.1f} us", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
