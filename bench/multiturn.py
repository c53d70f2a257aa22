"""Multi-turn benchmark of the fast engine: episodes that reuse their cached history, against re-prefilling
it every turn, against the same work as independent single-turn prompts.

    python bench/multiturn.py --device cuda --shape 0.5b --episodes 64 --turns 5 --prompt-len 512 \
        --obs-len 128 --response-len 128
    python bench/multiturn.py --device cpu --shape tiny --episodes 4 --prompt-len 32 --obs-len 8 \
        --response-len 8                                                       # CPU smoke test

B episodes run together, `--turns` turns each, one engine call per turn (as `ascent.envs.run_episodes`
drives it): turn 1 is a prompt of `--prompt-len` random tokens; each later turn sends the whole episode so
far plus an observation of `--obs-len` random tokens. Every turn generates exactly `--response-len` tokens
(no end-of-sequence token: the budget ends it). Four modes, each warmed up, then timed:
- `reuse`: every episode has its own session id, so the engine prefills only what follows its cache (the
  observation and the previous turn's last token);
- `no_reuse`: the same turns without a session id: the whole history is prefilled every turn;
- `independent`: `turns` x B single-turn prompts in one call, each as long as what the `reuse` mode prefills
  in one turn (the prompt, then observations), with the same response length: the same new tokens, with no
  history to attend to and all of them concurrent.
Reported per mode: wall time, prompt tokens prefilled and reused (engine stats), generated tokens and
tokens/s, the longest context; then the ratios. Random-weight Qwen2.5 shapes (no downloads), bf16 on a GPU,
fp32 on the CPU. `main(argv)` is what `ascent bench multiturn` calls.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_workload as W  # noqa: E402

from ascent.messages import GenerationRequest, SamplingParams  # noqa: E402


def make_engine(args: argparse.Namespace) -> Any:
    """A fast engine on a random-weight model of `args.shape` (its own fused copy of the weights)."""
    from transformers import AutoModelForCausalLM

    from ascent.rollout.fast import build_fast_engine

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(W.qwen_config(args.shape), dtype=dtype)
    turn_tokens = args.obs_len + args.response_len
    max_len = args.prompt_len + args.turns * turn_tokens + 16
    kv = None if device.type == "cuda" else (args.turns + 1) * args.episodes * max_len
    engine = build_fast_engine(
        model=model.eval(),
        dtype=dtype,
        device=device,
        eos_token_ids=[],
        max_model_len=max_len,
        max_batch_size=args.max_batch_size or args.turns * args.episodes,
        share_weights=False,
        gpu_memory_fraction=args.gpu_memory_fraction,
        kv_cache_tokens=kv,
    )
    del model
    return engine


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _params(args: argparse.Namespace, seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=args.response_len, seed=seed)


def run_turns(engine: Any, args: argparse.Namespace, reuse: bool, seed: int) -> dict[str, Any]:
    """B episodes of `turns` turns, one generate call per turn -> counters of the run."""
    rng = random.Random(seed)
    vocab = engine.runner.spec.vocab_size
    history = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.episodes)]
    turn_s = []
    for turn in range(args.turns):
        if turn:
            history = [h + [rng.randrange(vocab) for _ in range(args.obs_len)] for h in history]
        requests = [
            GenerationRequest(
                h,
                _params(args, seed * 100_000 + turn * 1000 + i),
                request_id=i,
                session_id=f"ep{seed}.{i}" if reuse else None,
            )
            for i, h in enumerate(history)
        ]
        t0 = time.perf_counter()
        out = engine.generate(requests)
        sync(args.device)
        turn_s.append(time.perf_counter() - t0)
        history = [h + gens[0].token_ids for h, gens in zip(history, out, strict=True)]
    generated = args.episodes * args.turns * args.response_len
    return {"turn_s": turn_s, "generated": generated, "max_context": max(len(h) for h in history)}


def run_independent(engine: Any, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """turns x B single-turn prompts (B of prompt length, the rest observation-long plus one) in one call."""
    rng = random.Random(seed)
    vocab = engine.runner.spec.vocab_size
    lengths = [args.prompt_len] * args.episodes + [args.obs_len + 1] * (args.episodes * (args.turns - 1))
    requests = [
        GenerationRequest(
            [rng.randrange(vocab) for _ in range(n)], _params(args, seed * 100_000 + i), request_id=i
        )
        for i, n in enumerate(lengths)
    ]
    t0 = time.perf_counter()
    engine.generate(requests)
    sync(args.device)
    generated = len(requests) * args.response_len
    return {
        "turn_s": [time.perf_counter() - t0],
        "generated": generated,
        "max_context": max(lengths) + args.response_len,
    }


def measure(engine: Any, args: argparse.Namespace, mode: str, seed: int) -> dict[str, Any]:
    """One timed run of `mode` on an engine with no cached sessions -> its numbers."""
    engine.sessions.clear()
    before = dict(engine.stats)
    paged = engine.runner.paged_prefill
    engine.runner.paged_prefill = paged and mode != "reuse_masked"
    try:
        if mode == "independent":
            res = run_independent(engine, args, seed)
        else:
            res = run_turns(engine, args, reuse=mode.startswith("reuse"), seed=seed)
    finally:
        engine.runner.paged_prefill = paged
    wall = sum(res["turn_s"])
    return {
        "wall_s": wall,
        "turn_s": [round(t, 4) for t in res["turn_s"]],
        "prefill_tokens": engine.stats["prefill_tokens"] - before["prefill_tokens"],
        "reused_tokens": engine.stats["reused_tokens"] - before["reused_tokens"],
        "generated_tokens": res["generated"],
        "tokens_per_s": res["generated"] / wall,
        "decode_steps": engine.stats["steps"] - before["steps"],
        "max_context": res["max_context"],
    }


MODES = ("reuse", "no_reuse", "independent", "reuse_masked")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    engine = make_engine(args)
    for mode in MODES:  # warm-up: compilation, graph capture, allocator
        measure(engine, args, mode, seed=1)
    res: dict[str, Any] = {mode: measure(engine, args, mode, seed=2 + k) for k, mode in enumerate(MODES)}
    r, n, i, rm = (res[m] for m in MODES)
    res["ratios"] = {
        "no_reuse_over_reuse_wall": n["wall_s"] / r["wall_s"],
        "no_reuse_over_reuse_prefill": n["prefill_tokens"] / max(1, r["prefill_tokens"]),
        "reuse_over_independent_wall": r["wall_s"] / i["wall_s"],
        "reuse_over_independent_prefill": r["prefill_tokens"] / max(1, i["prefill_tokens"]),
        "reuse_masked_over_reuse_wall": rm["wall_s"] / r["wall_s"],
    }
    res["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    res["device_name"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    return res


def report(res: dict[str, Any]) -> str:
    c = res["config"]
    lines = [
        f"{c['episodes']} episodes x {c['turns']} turns, prompt {c['prompt_len']}, observation "
        f"{c['obs_len']}, response {c['response_len']} tokens, shape {c['shape']} on {res['device_name']}",
        f"{'mode':<12} {'wall s':>8} {'prefilled':>10} {'reused':>10} {'generated':>10} {'tok/s':>9} "
        f"{'steps':>6} {'max ctx':>8}",
    ]
    for mode in MODES:
        m = res[mode]
        lines.append(
            f"{mode:<12} {m['wall_s']:>8.3f} {m['prefill_tokens']:>10} {m['reused_tokens']:>10} "
            f"{m['generated_tokens']:>10} {m['tokens_per_s']:>9.1f} {m['decode_steps']:>6} "
            f"{m['max_context']:>8}"
        )
    lines.append("turn times (reuse):    " + " ".join(f"{t:.3f}" for t in res["reuse"]["turn_s"]))
    lines.append("turn times (no_reuse): " + " ".join(f"{t:.3f}" for t in res["no_reuse"]["turn_s"]))
    lines += [f"{k}: {v:.2f}" for k, v in res["ratios"].items()]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda or cpu")
    ap.add_argument("--shape", choices=sorted(W.SHAPES), default="0.5b")
    ap.add_argument("--episodes", type=int, default=64, help="B: episodes run together")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=512, help="tokens of each episode's first prompt")
    ap.add_argument("--obs-len", type=int, default=128, help="T: observation tokens appended each later turn")
    ap.add_argument("--response-len", type=int, default=128, help="tokens generated every turn")
    ap.add_argument("--max-batch-size", type=int, default=0, help="decode rows (0: turns x episodes)")
    ap.add_argument("--gpu-memory-fraction", type=float, default=0.5)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print a summary and return the numbers (also written to --json)."""
    args = parse(argv)
    if args.device == "cpu":
        torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    res = bench(args)
    print(report(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
