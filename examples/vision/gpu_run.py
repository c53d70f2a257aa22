"""The zoom task's learning run at a real model size, in one command (issue #28).

    python examples/vision/gpu_run.py --place --gpus 3 --arms zoom,zoom,plain --lrs 3e-5,6e-5,3e-5  # 7.5 min
    python examples/vision/gpu_run.py --place --gpus 2 --json OUT/vision_3b.json   # with and without the tool
    python examples/vision/gpu_run.py --shape tiny --place --gpus 2 --rows 64 --val 8 --read-steps 4 \\
        --place-steps 2 --iterations 2 --val-every 1 --budget-s 900                  # the CPU check

`run_comparison.py`'s recipes at Qwen2.5-VL-3B's dimensions (random weights, bf16, the tiny setup's
tokenizer with the task's texts as whole tokens and its 4-token pixel budget, so the task is the same):
`make_setup.py --shape 3b` on the first GPU, the warm start there, then GRPO runs from it. Each step is a
real CLI call (echoed).

`--place` (run_comparison.py --place): stage 1 `sft_read.yaml` on `zoom/read_plastic.jsonl` (`--read-steps`
at `--sft-lr`), stage 2 `sft_place.yaml` on `zoom/place.jsonl` (`--place-steps` at `--place-lr`), then
`grpo_place.yaml` (one grammar a turn, validation sampled: `--val` questions x 4 at temperature 1) for
`--iterations`. Without `--place`: stage 1 on `zoom/read.jsonl`, then `grpo_turns.yaml` (greedy validation).
Rates: the tiny recipe's (hidden 64) over 32 for hidden 2048, as for muP's hidden matrices: SFT 5e-3 ->
1.5e-4 for both stages (stage 1 with 10 warm-up steps: nll 5.55 -> 0.54 in 78 steps on an H200; stage 2
with 4, its optimizer state fresh), GRPO 2e-3 -> 6e-5 (`grpo_place.yaml`); the default `--lr` 3e-5 is
half that, as lr 1e-4 collapsed the entropy in 18 iterations (before forced grammar tokens left the loss).

GRPO runs: `--arms` (zoom: with the tool; plain: without, `image_qa` with the word grammar alone) times
`--seeds`, each arm at its `--lrs` entry. `--gpus N` runs N of them at once, each on its own GPU
(CUDA_VISIBLE_DEVICES per process; on CPU, N processes); the setup and the warm start run on the first.

Time, measured (BENCHMARKS.md, 2026-11-27, 4x H200; the defaults below are that run's settings): setup
50 s, stage 1 143 s (64 steps with its load and save), stage 2 55 s (16 steps), then the GRPO runs at once,
178 s each with the tool (20 iterations of ~4.7 s, 3 validations of 64 x 4 sampled episodes in one decode
batch each, `--gen-batch`, load and save), 128 s without: 431 s in all under `--budget-s 490` (+ ~15 s of
gpu_run.sh). What made it fit: the run directory in /dev/shm (gpu_run.sh; a 7 GB checkpoint took 28 s to
write to the device's disk) and `--grpo-rows 256` (each GRPO run prepares all its questions through the
environment at start: 70 s for 2048). Stage 1 must end by 0.40 of the budget, stage 2 by 0.52; a GRPO run
that runs slow stops after a validation. With one GPU the runs go one after the other, fewer iterations each.

`--budget-s` bounds the whole command: stage 1 is stopped once `--sft-share` of it has passed and stage 2
at `--place-share` (each then starts from its newest checkpoint), the GRPO waves share what is left. A GRPO
run stops (SIGTERM: it ends its iteration and writes a checkpoint, `checkpoint.on_interrupt`) right after a
validation when the next one would not fit its share, so its last accuracy is a validated one.

Recorded, as JSON (`--json`, rewritten after every phase) and a table: the devices; per phase its wall time,
its GPU's peak memory in use (nvidia-smi memory.used, polled every 2 s: the whole device, CUDA context and
allocator cache included) and whether the budget stopped it; stage losses; per GRPO run held-out accuracy
at its start, every `--val-every` iterations and its end, per `--window` iterations the sampled episodes'
right-zoom rate (the zoom into the asked quarter; chance 0.25), their reward and reading (reward when the
zoom was right), and images/s (the images its episodes showed the model, one a model turn, over the
iterations' time). Every knob is a flag or a `key=value` override for every config (`--sft-set`,
`--place-set`, `--grpo-set` for one stage only).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from run_watch import (  # beside this file: the script's directory is on sys.path
    Phase,
    gpu_query,
    metric_lines,
    right_zoom_windows,
    run_phases,
    throughput,
)

HERE = Path(__file__).resolve().parent
EXIT_RESERVE_S = 30.0  # a GRPO run's share less this is its deadline: stopping takes an iteration and a save


@dataclass(frozen=True)
class GrpoRun:
    """One GRPO run: its arm (zoom: with the tool; plain: without), rate and seed; `name` is its run_dir's."""

    arm: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"grpo_{self.arm}_lr{self.lr:g}_s{self.seed}"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    arg = p.add_argument
    arg("--shape", choices=["3b", "tiny"], default="3b", help="the checkpoint's dimensions")
    arg("--device", default=None, help="cuda or cpu (default: cuda for 3b, cpu for tiny)")
    arg("--root", type=Path, default=Path("/tmp/ascent_vision"), help="model, data and runs")
    arg("--json", type=Path, default=None, help="write the results here")
    arg("--place", action="store_true", help="the --place recipe (default: --turns, stage 1 only)")
    arg("--gpus", type=int, default=1, help="GRPO runs at once, one GPU each (the warm start: the first)")
    arg("--budget-s", type=float, default=490.0, help="wall-clock bound of the whole command")
    arg("--sft-share", type=float, default=0.40, help="share of the budget by which stage 1 must end")
    arg("--place-share", type=float, default=0.52, help="share of the budget by which stage 2 must end")
    arg("--rows", type=int, default=2048, help="training questions (stage 1's demonstrations)")
    arg("--val", type=int, default=64, help="held-out questions")
    arg("--grpo-rows", type=int, default=256, help="GRPO trains on the first N questions (0: all)")
    arg("--seeds", type=int, default=1, help="GRPO seeds per arm")
    arg("--arms", default="zoom,plain", help="GRPO runs per seed: zoom (with the tool), plain (without)")
    arg("--read-steps", type=int, default=64, help="stage 1's optimizer steps (16 rows each)")
    arg("--sft-lr", type=float, default=1.5e-4, help="stage 1's lr (sft_read.yaml: 5e-3, tiny)")
    arg("--sft-warmup", type=int, default=10, help="stage 1's warm-up steps")
    arg("--place-steps", type=int, default=16, help="stage 2's optimizer steps (--place)")
    arg("--place-lr", type=float, default=1.5e-4, help="stage 2's lr (sft_place.yaml: 5e-3, tiny)")
    arg("--place-warmup", type=int, default=4, help="stage 2's warm-up steps")
    arg("--lr", type=float, default=3e-5, help="GRPO lr of every arm (grpo_place.yaml: 2e-3, tiny)")
    arg("--lrs", default=None, help="GRPO lr per arm, comma-separated (overrides --lr)")
    arg("--kl", type=float, default=None, help="GRPO algorithm.kl_loss_coef (yaml's if unset)")
    arg("--iterations", type=int, default=None, help="GRPO iterations (--place: 20, else 300)")
    arg("--val-every", type=int, default=10, help="GRPO held-out validation every K iterations")
    arg("--gen-batch", type=int, default=256, help="rollout.generation_batch_size (validation in one)")
    arg("--window", type=int, default=10, help="iterations per right-zoom window")
    arg("--drop-weights", action="store_true", help="delete each GRPO run's weights once recorded")
    arg("--sft-set", nargs="*", default=[], help="key=value overrides of stage 1 only")
    arg("--place-set", nargs="*", default=[], help="key=value overrides of stage 2 only")
    arg("--grpo-set", nargs="*", default=[], help="key=value overrides of the GRPO runs only")
    arg("overrides", nargs="*", help="key=value overrides of every config")
    a = p.parse_args(argv)
    a.device = a.device or ("cuda" if a.shape == "3b" else "cpu")
    a.iterations = a.iterations or (20 if a.place else 300)
    a.arms = [arm.strip() for arm in a.arms.split(",") if arm.strip()]
    if not a.arms or set(a.arms) - {"zoom", "plain"}:
        p.error(f"--arms={','.join(a.arms)}: name zoom, plain or both, comma-separated")
    lrs = [float(x) for x in a.lrs.split(",")] if a.lrs else [a.lr] * len(a.arms)
    if len(lrs) != len(a.arms):
        p.error(f"--lrs={a.lrs}: give one rate per arm of --arms={','.join(a.arms)}")
    a.runs = [GrpoRun(arm, lr, s) for s in range(1, a.seeds + 1) for arm, lr in zip(a.arms, lrs, strict=True)]
    if len({r.name for r in a.runs}) < len(a.runs):
        p.error("--arms/--lrs name one run twice: give the repeated arm another rate, or use --seeds")
    if a.gpus < 1:
        p.error(f"--gpus={a.gpus}: set it to 1 or more")
    # 3B weights are ~14 GB a run (fp32): a 64 GB disk holds the setup, the start and two runs
    a.drop_weights = a.drop_weights or (a.shape == "3b" and len(a.runs) > 1)
    return a


def common_overrides(a: argparse.Namespace) -> list[str]:
    """Every stage's device settings: bf16 on the GPU; gradient checkpointing (fp32 master weights, gradients
    and AdamW state of 3.4B parameters take ~55 GB, the engine's copy ~7 GB: a GRPO update's ~3k tokens of
    activations would not fit beside them); no optimizer state on disk (~27 GB a checkpoint); no
    torch.compile (a few thousand tokens a step: compiling each process's layers would cost more than it
    saves; `train.compile=auto` turns it back on)."""
    gpu = a.device.startswith("cuda")
    return [
        f"cluster.device={'cuda' if gpu else 'cpu'}",
        f"model.dtype={'bf16' if gpu else 'fp32'}",
        "model.gradient_checkpointing=true",
        "checkpoint.save_optimizer=false",
        "train.compile=off",
        "tracking.progress=false",
        *a.overrides,
    ]


def epochs_for(steps: int, recipe: str, data: Path) -> float:
    """`epochs` giving `steps` optimizer steps of the recipe's batch over `data`'s rows (the SFT entrypoint
    takes ceil(epochs * rows / batch_size); half a batch short keeps the ceiling at `steps`)."""
    batch = yaml.safe_load((HERE / recipe).read_text())["batch_size"]
    rows = sum(1 for line in data.read_text().splitlines() if line.strip())
    return (steps - 0.5) * batch / rows


def sft_command(
    a: argparse.Namespace, run: Path, stage: str, start: Path, epochs: float | None = None
) -> list[str]:
    """`stage` 1 (sft_read.yaml: on read_plastic.jsonl with --place, else read.jsonl) or 2 (sft_place.yaml on
    place.jsonl) into `run`, from `start`; `epochs` from the stage's steps unless given."""
    zoom = a.root / "zoom"
    if stage == "1":
        recipe, data = "sft_read.yaml", zoom / ("read_plastic.jsonl" if a.place else "read.jsonl")
        steps, lr, warmup, extra = a.read_steps, a.sft_lr, a.sft_warmup, a.sft_set
    else:
        recipe, data = "sft_place.yaml", zoom / "place.jsonl"
        steps, lr, warmup, extra = a.place_steps, a.place_lr, a.place_warmup, a.place_set
    epochs = epochs if epochs is not None else epochs_for(steps, recipe, data)
    return [
        "sft",
        str(HERE / recipe),
        f"run_dir={run}",
        f"model.path={start}",
        f"data.train_path={data}",
        f"epochs={epochs}",
        f"train.lr={lr}",
        f"train.warmup_steps={warmup}",
        *common_overrides(a),
        *extra,
    ]


def grpo_command(a: argparse.Namespace, run: Path, start: Path, spec: GrpoRun) -> list[str]:
    """`run_comparison.grpo_turns`'s call at this run's settings (`grpo_place.yaml` with --place, else
    `grpo_turns.yaml`): without the tool every turn takes the recipe's word grammar."""
    recipe = HERE / ("grpo_place.yaml" if a.place else "grpo_turns.yaml")
    turns = yaml.safe_load(recipe.read_text())["rollout"]["grammar"]
    plain = (
        []
        if spec.arm == "zoom"
        else ["rollout.source.env=image_qa", f"rollout.grammar={json.dumps(turns[1:])}"]
    )
    kl = [f"algorithm.kl_loss_coef={a.kl}"] if a.kl is not None else []
    return [
        "train",
        str(recipe),
        f"run_dir={run}",
        f"seed={spec.seed}",
        f"model.path={start}",
        f"data.train_path={grpo_rows(a, spec.arm)}",
        f"data.val_path={a.root / spec.arm / 'val.jsonl'}",
        f"iterations={a.iterations}",
        f"val_every={a.val_every}",
        f"train.lr={spec.lr}",
        "rollout.engine=reference",  # the per-turn grammar needs it
        f"rollout.generation_batch_size={a.gen_batch}",
        *plain,
        *kl,
        *common_overrides(a),
        *a.grpo_set,
    ]


def grpo_rows(a: argparse.Namespace, arm: str) -> Path:
    """The arm's training questions, or the file of their first --grpo-rows beside it (`write_grpo_rows`;
    image paths stay relative to it): each GRPO run prepares every question through its environment at
    start, 70 s for 2048 at the 3B shape, while 20 iterations of 8 use 160."""
    rows = a.root / arm / "rows.jsonl"
    return rows.with_name(f"rows_first{a.grpo_rows}.jsonl") if a.grpo_rows else rows


def write_grpo_rows(a: argparse.Namespace) -> None:
    """After the setup: each arm's first --grpo-rows questions, in `grpo_rows`'s file."""
    for arm in {spec.arm for spec in a.runs}:
        subset = grpo_rows(a, arm)
        if a.grpo_rows and not subset.exists():
            lines = (a.root / arm / "rows.jsonl").read_text().splitlines(keepends=True)
            subset.write_text("".join(lines[: a.grpo_rows]))


def gpu_ids(a: argparse.Namespace) -> list[str | None]:
    """The `--gpus` devices, as CUDA_VISIBLE_DEVICES names them (the first ones it lists, if set); on CPU
    N slots with no device."""
    if not a.device.startswith("cuda"):
        return [None] * a.gpus
    visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    ids = visible or [str(i) for i in range(a.gpus)]
    if len(ids) < a.gpus:
        sys.exit(f"--gpus={a.gpus}: CUDA_VISIBLE_DEVICES lists {len(ids)}; ask for at most that many")
    return list(ids[: a.gpus])


def newest_weights(run_dir: Path) -> Path:
    """A stage's finished weights: `final`, else (stopped by the budget) its newest checkpoint."""
    if (run_dir / "final" / "config.json").exists():
        return run_dir / "final"
    found = sorted((run_dir / "checkpoints").glob("iter_*"))
    if not found:
        sys.exit(f"{run_dir}: neither final/ nor a checkpoint: raise --budget-s or --sft-share")
    return found[-1]


def drop_weights(run_dir: Path) -> None:
    for weights in run_dir.glob("**/*.safetensors"):
        weights.unlink()


def sft_stage(a: argparse.Namespace, report: dict[str, Any], name: str, argv: list[str], end: float) -> None:
    """One SFT stage (`name`: its run_dir under --root) on the first GPU, stopped at `end`; exits if it fails."""
    shutil.rmtree(a.root / name, ignore_errors=True)
    phase = Phase(name, a.root / name, end)
    (result,) = run_phases([(phase, [sys.executable, "-m", "ascent", *argv], a.gpu_ids[0])])
    report["phases"][name] = result | {
        "nll": [round(x, 4) for x in phase.losses],
        "steps": len(phase.losses),
    }
    write(a, report)
    if not result["ok"]:
        sys.exit(f"[{name}] failed (exit {result['exit']}): {shlex.join(argv)}")


def warm_start(a: argparse.Namespace, t0: float, report: dict[str, Any]) -> Path:
    """make_setup.py at `--shape` (a subprocess: the parent never holds a CUDA context), stage 1, and with
    --place stage 2, on the first GPU; returns the start's weights."""
    setup = [sys.executable, str(HERE / "make_setup.py"), str(a.root), "--rows", str(a.rows)]
    setup += ["--val", str(a.val), "--shape", a.shape, "--device", a.device]
    (result,) = run_phases([(Phase("setup", None, t0 + a.budget_s), setup, a.gpu_ids[0])])
    report["phases"]["setup"] = result
    write(a, report)
    if not result["ok"]:
        sys.exit(f"[setup] failed (exit {result['exit']}): {shlex.join(setup)}")
    write_grpo_rows(a)
    read = "sft_plastic" if a.place else "sft_read"
    sft_stage(
        a, report, read, sft_command(a, a.root / read, "1", a.root / "model"), t0 + a.sft_share * a.budget_s
    )
    start = newest_weights(a.root / read)
    if not a.place:
        return start
    argv = sft_command(a, a.root / "sft_place", "2", start)
    sft_stage(a, report, "sft_place", argv, t0 + a.place_share * a.budget_s)
    if a.shape == "3b":  # stage 1's weights are no run's start now (disk: ~14 GB)
        drop_weights(a.root / read)
    return newest_weights(a.root / "sft_place")


def grpo_runs(a: argparse.Namespace, t0: float, start: Path, report: dict[str, Any]) -> None:
    """The GRPO runs from `start`, in waves of --gpus at once (one GPU each), sharing what is left of the
    budget evenly among the waves."""
    waves = [a.runs[i : i + a.gpus] for i in range(0, len(a.runs), a.gpus)]
    for w, wave in enumerate(waves):
        left = t0 + a.budget_s - time.time()
        deadline = time.time() + left / (len(waves) - w) - EXIT_RESERVE_S
        jobs = []
        for spec, gpu in zip(wave, a.gpu_ids, strict=False):
            run = a.root / spec.name
            shutil.rmtree(run, ignore_errors=True)
            argv = [sys.executable, "-m", "ascent", *grpo_command(a, run, start, spec)]
            jobs.append((Phase(spec.name, run, deadline, stop_after_val=True), argv, gpu))
        for (phase, _, _), spec, timing in zip(jobs, wave, run_phases(jobs), strict=True):
            record(a, report, phase, spec, timing)


def record(a: argparse.Namespace, report: dict[str, Any], phase: Phase, spec: GrpoRun, timing: dict) -> None:
    """One ended GRPO run into the report: held out at its start and end, windows, throughput."""
    run = a.root / spec.name
    vals = [[it, acc] for it, acc, _ in phase.vals]
    done = metric_lines(run / "metrics.jsonl", 0)[0]
    report["phases"][spec.name] = timing
    report["runs"].append(
        {
            "name": spec.name,
            "arm": spec.arm,
            "lr": spec.lr,
            "seed": spec.seed,
            "iterations_done": max((m.get("step", 0) for m in done), default=0),
            "val": vals,
            "start": vals[0][1] if vals else None,
            "end": vals[-1][1] if len(vals) > 1 else None,
            "end_iteration": vals[-1][0] if len(vals) > 1 else None,
            "windows": right_zoom_windows(run, a.window) if spec.arm == "zoom" else [],
            **throughput(run, done),
            **timing,
        }
    )
    if not timing["ok"]:
        report["failed"].append(spec.name)
    write(a, report)
    if a.drop_weights:
        drop_weights(run)


def write(a: argparse.Namespace, report: dict[str, Any]) -> None:
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=1))


def table(report: dict[str, Any]) -> str:
    lines = ["phase | seconds | GPU | peak GPU MiB | stopped by budget", "--- | --- | --- | --- | ---"]
    for name, p in report["phases"].items():
        lines.append(
            f"{name} | {p['seconds']:.0f} | {p['gpu']} | {p['peak_gpu_mib'] or '-'} | {p['stopped']}"
        )
    for stage in ("sft_read", "sft_plastic", "sft_place"):
        nll = report["phases"].get(stage, {}).get("nll", [])
        if nll:
            tail = nll[-10:]
            mean = sum(tail) / len(tail)
            lines.append(f"{stage} nll ({len(nll)} steps): step 1 {nll[0]:.3f}, last {len(tail)} {mean:.3f}")
    lines += ["", "run | iterations | held out (iteration: accuracy) | right zoom per window | images/s"]
    for r in report["runs"]:
        held = ", ".join(f"{it}: {acc:.3f}" for it, acc in r["val"])
        zooms = " / ".join(f"{w['right_zoom']:.2f}" for w in r["windows"]) or "-"
        lines.append(f"{r['name']} | {r['iterations_done']} | {held} | {zooms} | {r['images_per_s']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    t0 = time.time()
    a.root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    a.gpu_ids = gpu_ids(a)
    args = json.loads(json.dumps(vars(a), default=str))
    devices = [gpu_query("name", g) or a.device for g in a.gpu_ids]
    report: dict[str, Any] = {"args": args, "devices": devices, "phases": {}, "runs": [], "failed": []}
    start = warm_start(a, t0, report)
    grpo_runs(a, t0, start, report)
    report["total_seconds"] = round(time.time() - t0, 1)
    write(a, report)
    print("\n" + table(report) + f"\ntotal {report['total_seconds']:.0f}s", flush=True)
    if report["failed"]:
        sys.exit(f"GRPO runs failed: {', '.join(report['failed'])} (the others are recorded)")
    return report


if __name__ == "__main__":
    main()
