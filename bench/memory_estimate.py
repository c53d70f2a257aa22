"""`ascent doctor`'s memory estimate against the measured peak of real GRPO iterations.

    python bench/memory_estimate.py CONFIG [key=value ...] [--iterations 2]      # a run config
    python bench/memory_estimate.py --shape 0.5b --micro-batch-tokens 24576 --logprob-chunk 1024
    python bench/memory_estimate.py --shape 1.5b --micro-batch-tokens 24576 --logprob-chunk 2048

With `--shape`, the config is the one bench/e2e.py builds for that shape (the benchmark configs of
BENCHMARKS.md; every other e2e option, e.g. `--prompts`, passes through). The loop is built as `ascent
train` builds it (inline, colocated) and `--iterations` iterations run through `run_iteration`; each top-level
phase records torch.cuda.max_memory_allocated / reserved (bench/e2e.py's PeakTimeline). Printed: the
estimate per phase, the measured peaks per phase of every iteration, and estimate / measured for the peak
allocated memory of the iterations after the first (the first compiles and creates AdamW's moments; with
one iteration, that one). The issue's goal: within 15% for the 0.5B and 1.5B configs. Without CUDA it
reports 'no CUDA: estimate only' and the process's peak RSS (a smoke test on the tiny model).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e  # noqa: E402

from ascent.doctor.memory import GIB, Estimate  # noqa: E402


def estimate_for(cfg: Any, gpu_gib: float | None) -> Estimate:
    """The doctor's estimate of `cfg` on this GPU (or `gpu_gib`)."""
    from ascent.doctor import model, plan

    result, shape = model.check_model(cfg)
    if shape is None:
        raise SystemExit(f"model check failed: {result.detail}")
    gpu = int(gpu_gib * GIB) if gpu_gib else 0
    if not gpu and torch.cuda.is_available():
        gpu = torch.cuda.get_device_properties(0).total_memory
    return plan.run_estimate(cfg, shape, gpu, 1 if gpu else 0)[1]


def build_from_config(path: str, overrides: list[str], root: Path) -> tuple[Any, Any, Any]:
    """(Run, LoopState, RunConfig) of a run config, built the way `run_training` builds them."""
    from ascent.config import RunConfig, load_config
    from ascent.data import PromptSampler
    from ascent.orchestrator import setup
    from ascent.orchestrator.loop import publish_weights
    from ascent.orchestrator.run import build_run, initial_state

    cfg = load_config(path, [f"run_dir={root / 'run'}", *overrides], RunConfig)
    datasets = setup.build_datasets(cfg)
    groups = setup.build_worker_groups(cfg)
    timeline = e2e.PeakTimeline(str(root / "trace.json"), torch.cuda.is_available())
    run = build_run(cfg, datasets, setup.build_reward_runner(cfg), groups, timeline)
    sampler = PromptSampler(len(datasets.train), cfg.rollout.prompts_per_step, seed=cfg.seed, shuffle=True)
    publish_weights(run, version=0)
    return run, dataclasses.replace(initial_state(cfg, datasets), sampler=sampler), cfg


def measure(ctx: Any, state: Any, iterations: int) -> list[dict[str, tuple[float, float]]]:
    """Run the iterations; each one's {phase: (peak allocated GiB, peak reserved GiB)}."""
    rows = []
    for it in range(1, iterations + 1):
        e2e.iterate(ctx, state, it)
        rows.append(dict(ctx.timeline.peaks))
        print(
            f"iteration {it}: "
            + json.dumps({k: [round(a, 2), round(r, 2)] for k, (a, r) in rows[-1].items()}),
            flush=True,
        )
    return rows


def summary(est: Estimate, rows: list[dict[str, tuple[float, float]]]) -> dict[str, Any]:
    """The estimate by phase, the measured peaks, and estimate / measured of the peak allocated memory."""
    out: dict[str, Any] = {
        "estimate_gib": {p: est.total(p) / GIB for p in est.phases},
        "estimate_terms_gib": {p: {k: v / GIB for k, v in t.items()} for p, t in est.phases.items()},
        "estimate_peak_gib": est.peak / GIB,
        "estimate_peak_phase": est.peak_phase(),
        "measured_gib": rows,
    }
    if not torch.cuda.is_available():
        out["note"] = "no CUDA: estimate only"
        out["cpu_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
        return out
    steady = rows[1:] or rows
    alloc = max(a for row in steady for a, _ in row.values())
    reserved = max(r for row in steady for _, r in row.values())
    out.update(
        measured_peak_allocated_gib=alloc,
        measured_peak_reserved_gib=reserved,
        ratio_allocated=est.peak / GIB / alloc,
        ratio_reserved=est.peak / GIB / reserved,
    )
    phase_ratio = {p: est.total(p) / GIB / steady[-1][p][0] for p in est.phases if p in steady[-1]}
    out["ratio_by_phase"] = phase_ratio
    return out


def report(res: dict[str, Any]) -> str:
    lines = ["estimate per phase (GiB): " + ", ".join(f"{p} {v:.2f}" for p, v in res["estimate_gib"].items())]
    for phase, terms in res["estimate_terms_gib"].items():
        lines.append(f"  {phase}: " + ", ".join(f"{k} {v:.2f}" for k, v in terms.items() if v))
    if "note" in res:
        lines.append(f"{res['note']}; CPU peak RSS {res['cpu_peak_rss_gib']:.2f} GiB")
        return "\n".join(lines)
    lines.append(
        f"peak: estimate {res['estimate_peak_gib']:.2f} GiB ({res['estimate_peak_phase']}), measured "
        f"allocated {res['measured_peak_allocated_gib']:.2f} / reserved "
        f"{res['measured_peak_reserved_gib']:.2f} GiB -> "
        f"estimate/measured {res['ratio_allocated']:.3f} (allocated), {res['ratio_reserved']:.3f} (reserved)"
    )
    lines.append(
        "by phase (estimate / measured allocated): "
        + ", ".join(f"{p} {r:.3f}" for p, r in res["ratio_by_phase"].items())
    )
    return "\n".join(lines)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """-> (our options with `config` the first argument when it is not an option, the rest: overrides or
    bench/e2e.py options)."""
    config = argv[0] if argv and not argv[0].startswith("-") else None
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(e2e.W.SHAPES), help="bench/e2e.py's config for this shape")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--gpu-memory", type=float, default=None, help="estimate for a GPU of this many GiB")
    ap.add_argument("--json", type=Path, default=None)
    args, rest = ap.parse_known_args(argv[1:] if config else argv)
    args.config = config
    return args, rest


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, rest = parse(list(sys.argv[1:] if argv is None else argv))
    if (args.config is None) == (args.shape is None):
        raise SystemExit("give a run config YAML or --shape (not both)")
    root = Path(tempfile.mkdtemp(prefix="ascent_memest_"))
    if args.shape:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        e2e_args = e2e.parse(
            [
                "--shape",
                args.shape,
                "--device",
                device,
                "--warmup",
                "0",
                "--iterations",
                str(args.iterations),
                "--root",
                str(root),
                *rest,
            ]
        )
        ctx, sampler, facts = e2e.build_loop(e2e_args, root)
        cfg = facts["config"]
    else:
        ctx, sampler, cfg = build_from_config(args.config, [r for r in rest if "=" in r], root)
    est = estimate_for(cfg, args.gpu_memory)
    res = summary(est, measure(ctx, sampler, args.iterations))
    ctx.rollout.shutdown()
    ctx.trainer.shutdown()
    print(report(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
