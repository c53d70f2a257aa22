"""End-to-end GRPO iteration benchmark: our loop on one GPU, timed by phase.

    python bench/e2e.py --shape 0.5b --json e2e_05b.json      # or: ascent bench e2e --shape 1.5b

The real components, colocated in one process exactly as `ascent train` builds them (`cluster.backend=inline`,
`rollout.engine=fast`, `model.dtype=bf16`): the fast engine generates, the reward runner scores, the
PolicyWorker computes old logprobs and takes the optimizer step while the engine sleeps (KV cache freed),
then the weights are published to the engine. Each iteration is `ascent.orchestrator.loop.run_iteration`.
Workload (bench/e2e_workload.py, shared with bench/trl_baseline.py): random-weight Qwen2.5 shapes, 32
prompts x 8 samples, 256-token prompts, exactly 512 new tokens (EOS off), a coin-flip reward.

Reports per phase (seconds, peak GiB allocated), completions/s, tokens/s, and the update's MFU =
6 * params * tokens / update time / peak bf16 FLOP/s, against both the 8192^3 matmul rate measured in this
run and the nominal 790 TFLOP/s. Results go to --json after every iteration, so a run cut short keeps them.
`--profile` adds one iteration with the trainer's calls under torch.profiler (bench/e2e_profile.py);
`--trainer-compile off`, `--old-logprobs recompute` (the eager trainer with a separate old-logprob pass:
the same-run baseline of those two features), `--no-grad-ckpt`, `--micro-batch-tokens` and `--trainer-attn
sdpa` are experiments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_profile as P  # noqa: E402
import e2e_workload as W  # noqa: E402

from ascent.tracking import Timeline  # noqa: E402

NOMINAL_PEAK = 790e12
PHASES = ("rollout", "generate", "reward", "logprobs", "advantages", "update", "publish")


class PeakTimeline(Timeline):
    """A Timeline that synchronizes the GPU at the end of each top-level phase (honest host-clock times)
    and records each top-level phase's peak allocated and reserved memory."""

    def __init__(self, path: Any, cuda: bool) -> None:
        super().__init__(path)
        self.cuda, self.depth, self.peaks = cuda, 0, {}

    @contextlib.contextmanager
    def phase(self, name: str, **args: Any):
        top = self.cuda and self.depth == 0
        if top:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.depth += 1
        try:
            with super().phase(name, **args) as record:
                yield record
                if top:
                    torch.cuda.synchronize()
        finally:
            self.depth -= 1
        if top:
            self.peaks[name] = (
                torch.cuda.max_memory_allocated() / 2**30,
                torch.cuda.max_memory_reserved() / 2**30,
            )


def kv_fraction(args: argparse.Namespace, model_path: Path) -> float:
    """gpu_memory_fraction that leaves the engine a KV cache of --kv-gib (default: the whole workload's
    tokens without prefix sharing, +10%) after its bf16 weights and activation reserve."""
    from transformers import AutoConfig

    from ascent.rollout.fast import _activation_reserve
    from ascent.rollout.fast.spec import spec_from_config

    spec = spec_from_config(AutoConfig.from_pretrained(str(model_path)))
    tokens = args.prompts * args.samples * (args.prompt_len + args.new_tokens)
    kv = args.kv_gib * 2**30 if args.kv_gib else 1.1 * tokens * spec.kv_bytes_per_token(torch.bfloat16)
    weights = 2 * W.num_params(args.shape) * 1.02
    reserve = _activation_reserve(spec, min(256, args.prompts * args.samples), 16384, torch.bfloat16)
    total = torch.cuda.get_device_properties(0).total_memory
    return min(0.95, (kv + weights + reserve) / total)


def run_config(args: argparse.Namespace, model: Path, data: Path, run_dir: Path, frac: float) -> Any:
    from ascent.config.schema import RunConfig

    return RunConfig.model_validate(
        {
            "run_dir": str(run_dir),
            "iterations": args.warmup + args.iterations,
            "seed": 0,
            "model": {"path": str(model), "dtype": args.dtype, "gradient_checkpointing": args.grad_ckpt},
            "data": {"train_path": str(data), "max_prompt_tokens": args.prompt_len, "chat_template": False},
            "rollout": {
                "engine": "fast",
                "prompts_per_step": args.prompts,
                "samples_per_prompt": args.samples,
                "max_new_tokens": args.new_tokens,
                "temperature": 1.0,
                "gpu_memory_fraction": frac,
            },
            "reward": {"fn": "bench_coin", "isolation": "inline"},  # registered in this process (below)
            "train": {
                "lr": 1e-6,
                "trajectories_per_update": args.prompts * args.samples // args.updates,
                "max_tokens_per_micro_batch": args.micro_batch_tokens,
                "logprob_chunk_tokens": args.logprob_chunk,
                "keep_head_logits": args.keep_head_logits,
                "compile": args.trainer_compile,
                "old_logprobs": args.old_logprobs,
            },
            "cluster": {
                "device": args.device,
                "backend": "inline",
                "placement": "colocated",
                "engine_sleeps": not args.engine_awake,
            },
            "tracking": {"tensorboard": False, "progress": False},
        }
    )


def build_loop(args: argparse.Namespace, root: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(Run, LoopState, setup facts): the parts `run_training` builds, plus our bench tweaks."""
    from ascent.data import PromptSampler
    from ascent.orchestrator import setup
    from ascent.orchestrator.loop import publish_weights
    from ascent.orchestrator.run import build_run, initial_state
    from ascent.rewards.registry import REWARD_FUNCTIONS

    REWARD_FUNCTIONS["bench_coin"] = W.coin_reward
    t0 = time.perf_counter()
    model = W.make_checkpoint(root, args.shape, args.device)
    data = W.write_prompts(root, max(4 * args.prompts, 128), args.prompt_len)
    cuda = args.device == "cuda"
    frac = kv_fraction(args, model) if cuda else 0.5
    cfg = run_config(args, model, data, root / f"run_{args.shape}", frac)
    datasets = setup.build_datasets(cfg)
    rewards = setup.build_reward_runner(cfg)
    groups = setup.build_worker_groups(cfg)
    engine = groups.rollout._worker.engine
    engine.eos = frozenset()  # fixed-length responses: never stop early
    facts: dict[str, Any] = {"gpu_memory_fraction": frac, "kv_cache_gib": engine.cache.nbytes / 2**30}
    policy_model = groups.trainer._worker.policy.model
    if args.trainer_attn == "sdpa":  # the trainer workers switch to varlen on CUDA; undo it to compare
        policy_model.set_attn_implementation("sdpa")
    facts["trainer_attention"] = policy_model.config._attn_implementation
    facts["trainer_compiled"] = groups.trainer._worker.policy.compiled
    facts["capture_clock"] = P.CaptureClock(engine)
    timeline = PeakTimeline(str(root / f"trace_{args.shape}.json"), cuda)
    run = build_run(cfg, datasets, rewards, groups, timeline)
    state = dataclasses.replace(
        initial_state(cfg, datasets),
        sampler=PromptSampler(len(datasets.train), args.prompts, seed=0, shuffle=True),
    )
    publish_weights(run, version=0)
    facts["setup_s"] = time.perf_counter() - t0
    facts["config"] = cfg  # the run keeps only what its loop reads (memory_estimate sizes from the config)
    return run, state, facts


def iterate(run: Any, state: Any, it: int) -> dict[str, float]:
    """One iteration of the loop (no experience store)."""
    from ascent.orchestrator.experience import ExperienceLog
    from ascent.orchestrator.loop import run_iteration

    return run_iteration(run, state, ExperienceLog(None), it)


def iteration_row(
    ctx: Any, metrics: dict[str, float], args: argparse.Namespace, peak: float, capture_clock: Any
) -> dict[str, Any]:
    """One iteration's numbers: phase times, peaks, throughput, MFU."""
    n_traj = args.prompts * args.samples
    tokens = n_traj * (args.prompt_len + args.new_tokens)
    new = metrics["rollout/response_len_mean"] * n_traj
    row: dict[str, Any] = {k: metrics.get(f"time/{k}") for k in PHASES}
    row.update(
        iteration_s=metrics["time/iteration"],
        publish_copy_s=metrics["time/weight_transfer"],
        completions_per_s=n_traj / metrics["time/iteration"],
        tokens_per_s=tokens / metrics["time/iteration"],
        rollout_new_tokens_per_s=new / metrics["time/generate"],
        response_len_mean=metrics["rollout/response_len_mean"],
        optimizer_steps=metrics.get("train/optimizer_steps"),
        peaks_gib=dict(ctx.timeline.peaks),
        graph_capture_s=capture_clock.take(),
        logprob_diff_mean=metrics.get("rollout/logprob_diff_mean"),
        logprob_diff_max=metrics.get("rollout/logprob_diff_max"),
    )
    flops = 6 * W.num_params(args.shape) * tokens
    row["update_tflops"] = flops / metrics["time/update"] / 1e12
    row["mfu_update_measured_peak"] = flops / metrics["time/update"] / peak if peak else None
    row["mfu_update_nominal_790"] = flops / metrics["time/update"] / NOMINAL_PEAK
    if ctx.timeline.peaks:
        row["peak_allocated_gib"] = max(p[0] for p in ctx.timeline.peaks.values())
        row["peak_reserved_gib"] = max(p[1] for p in ctx.timeline.peaks.values())
    return row


def profile_iteration(ctx: Any, state: Any, it: int) -> dict[str, Any]:
    """One more iteration with the trainer's logprobs and update calls under torch.profiler."""
    out: dict[str, Any] = {}
    with P.profiled_methods(ctx.trainer._worker, ("compute_logprobs", "update"), out):
        iterate(ctx, state, it)
    return out


def snapshot_iteration(ctx: Any, state: Any, it: int, path: Path) -> None:
    """One more iteration with the CUDA caching allocator's history recorded; the snapshot (a pickle that
    pytorch.org/memory_viz or `bench/memory_peak.py` reads) goes to `path`."""
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    base = torch.cuda.memory_allocated()
    try:
        iterate(ctx, state, it)
        torch.cuda.memory._dump_snapshot(str(path))
        path.with_suffix(".base").write_text(str(base))  # allocated before recording (weights, AdamW)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over the timed iterations of every numeric field."""
    keys = [k for k, v in rows[0].items() if isinstance(v, int | float)]
    return {k: statistics.median(r[k] for r in rows if r.get(k) is not None) for k in keys}


def report(res: dict[str, Any]) -> str:
    s, a = res.get("median", {}), res["args"]
    if not s:
        return "no timed iteration finished"
    lines = [
        f"{res['facts'].get('device', 'cpu')}  shape {a['shape']}  {a['prompts']}x{a['samples']}  "
        f"prompt {a['prompt_len']}  new {a['new_tokens']}  micro-batch {a['micro_batch_tokens']} tokens  "
        f"grad-ckpt {a['grad_ckpt']}  attn {a['trainer_attn']}  compile {a['trainer_compile']}  "
        f"old-logprobs {a['old_logprobs']}  keep-head-logits {a.get('keep_head_logits', False)}",
        f"iteration {s['iteration_s']:.2f} s  ->  {s['completions_per_s']:.1f} completions/s, "
        f"{s['tokens_per_s']:.0f} tokens/s (median of {len(res['iterations'])})",
        "phases (s): " + "  ".join(f"{k} {s[k]:.3f}" for k in PHASES if k in s),
        f"rollout {s['rollout_new_tokens_per_s']:.0f} new tok/s (CUDA-graph recapture "
        f"{s['graph_capture_s']:.2f} s); "
        f"publish copy {1e3 * s['publish_copy_s']:.1f} ms; sampler/trainer |logprob diff| mean "
        f"{s.get('logprob_diff_mean', float('nan')):.2e} max {s.get('logprob_diff_max', float('nan')):.2e}",
        f"update {s['update_tflops']:.0f} TFLOP/s (6ND): MFU {100 * s['mfu_update_nominal_790']:.1f}% of 790 "
        f"TFLOP/s"
        + (
            f", {100 * s['mfu_update_measured_peak']:.1f}% of measured "
            f"{res['facts']['matmul_peak_tflops']:.0f}"
            if s.get("mfu_update_measured_peak")
            else ""
        ),
        f"peak allocated {s.get('peak_allocated_gib', 0):.1f} GiB, reserved "
        f"{s.get('peak_reserved_gib', 0):.1f} GiB;"
        f" per phase {res['iterations'][-1]['peaks_gib']}",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(W.SHAPES), default="0.5b")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--updates", type=int, default=1, help="optimizer steps per iteration")
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--logprob-chunk", type=int, default=1024)
    ap.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--keep-head-logits", action="store_true", help="train.keep_head_logits=true")
    ap.add_argument("--trainer-attn", choices=["varlen", "sdpa"], default="varlen")
    ap.add_argument("--profile", action="store_true", help="one more iteration under torch.profiler")
    ap.add_argument("--trainer-compile", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--old-logprobs", choices=["auto", "recompute"], default="auto")
    ap.add_argument(
        "--memory-snapshot", type=Path, default=None, help="one more iteration, allocator history"
    )
    ap.add_argument("--kv-gib", type=float, default=None, help="engine KV cache size (default: workload)")
    ap.add_argument(
        "--engine-awake",
        action="store_true",
        help="cluster.engine_sleeps=false: the engine keeps its KV cache and CUDA graphs through the update",
    )
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--root", type=Path, default=Path("/tmp/ascent_e2e"))
    ap.add_argument("--json", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print a summary and return (and write to --json) the numbers."""

    args = parse(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    res = W.report_header(args)
    peak = W.matmul_peak_flops() if args.device == "cuda" else 0.0
    res["facts"]["matmul_peak_tflops"] = peak / 1e12
    ctx, state, facts = build_loop(args, args.root)
    capture_clock = facts.pop("capture_clock")
    facts.pop("config")
    res["facts"].update(facts)
    res["iterations"], res["warmup"] = [], []
    for it in range(1, args.warmup + args.iterations + 1):
        row = iteration_row(ctx, iterate(ctx, state, it), args, peak, capture_clock)
        (res["warmup"] if it <= args.warmup else res["iterations"]).append(row)
        if res["iterations"]:
            res["median"] = summarize(res["iterations"])
        print(
            f"iteration {it}: {row['iteration_s']:.2f} s " + json.dumps({k: row[k] for k in PHASES}),
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps(res, indent=1, default=str))
    if args.profile:
        res["profile"] = profile_iteration(ctx, state, args.warmup + args.iterations + 1)
        print(json.dumps(res["profile"], indent=1), flush=True)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1, default=str))
    if args.memory_snapshot:
        try:
            snapshot_iteration(ctx, state, args.warmup + args.iterations + 2, args.memory_snapshot)
        except Exception as e:  # a failed snapshot must not lose the timings above (seen: torch 2.11 +
            print(f"memory snapshot failed: {e!r}", flush=True)  # compiled checkpointed chunks)
    ctx.rollout.shutdown()
    ctx.trainer.shutdown()
    print(report(res), flush=True)
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
