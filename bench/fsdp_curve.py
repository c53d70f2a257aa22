"""FSDP2 loss-curve check: the same `ascent train` run on one trainer rank and on two FSDP2-sharded ranks.

    PYTHONPATH=/tmp/site:$PWD python3 bench/fsdp_curve.py --device cuda --out $OUT/fsdp.json   # 2 GPUs
    python3 bench/fsdp_curve.py --device cpu --out /tmp/fsdp_cpu.json                          # gloo, ~1 min

What it runs (the arithmetic demo's tooling, examples/arithmetic/):
1. data (`make_data.make`), a tiny Qwen2 checkpoint (`ascent.models.tiny`) and a short SFT warm start
   (`ascent sft`, inline, one device), so that GRPO starts with a reward that is neither 0 nor 1. They are
   cached in --workdir and reused on the next call; `--model` / `--data` bring your own instead.
2. `ascent train` twice, on identical config, data and seed, both with `cluster.backend=ray`, differing only
   in the trainer: (a) one trainer worker, `train.sharding=none`; (b) two trainer workers with
   `train.sharding=fsdp`. Each run is `sys.executable -m ascent train ...` (no installed `ascent` needed).
   Placement on CUDA: `cluster.placement=colocated`, `cluster.gpus_per_worker=1`. The trainer group then
   reserves one whole GPU per rank, and the rollout worker asks for no GPU: Ray (2.60) leaves its
   CUDA_VISIBLE_DEVICES alone, so it sees every GPU of the run and uses cuda:0, sharing that GPU with the
   trainer rank placed there (the engine sleeps while the trainer updates). Run (a) sees one GPU
   (CUDA_VISIBLE_DEVICES = the first one), run (b) two. `placement=split` would give the rollout worker
   its own `gpus_per_worker` as well: 3 GPUs at 1 each, and at 0.5 each the trainer's PACK group may put
   both ranks on one GPU, which NCCL refuses.
   On CPU: gloo, `cluster.cpus_per_worker=0.5`, the reference engine, fp32.
3. A table per iteration of loss/policy, reward/mean, grad_norm, entropy and rollout/logprob_diff_mean for
   (a) and (b), their means, the largest |a - b| of each, the wall time of each run; --out gets both curves
   (and every logged metric) as JSON.
`--trainer-compile off` (the default) sets `train.compile=off` where the config has that field: compiling the
trainer costs about 50 s per process on a GPU and is not what this compares; `auto` runs it as users do.

Iteration 1 samples the same trajectories in both runs (same seed, same engine, same starting weights), so
its differences come from the trainer alone: how the mini-batch is split over ranks, the reduction order and,
in bf16, the precision of the forward (see below); its metrics average the iteration's optimizer steps, and
AdamW's first steps (about lr * sign(grad)) magnify tiny gradient differences in the later ones. Once the
updated weights differ, the sampler draws different tokens and the curves drift apart as two seeds of one run
would: judge later iterations by trend (the `mean` row), not digits. In fp32 (the CPU mode) the rollouts
stay identical and the curves agree to about 1e-6.
In bf16 the two trainers do not compute the same forward: one rank runs torch.autocast over fp32 weights
(fp32 residual stream and norms), FSDP2's MixedPrecisionPolicy(param_dtype=bf16) gathers bf16 weights and
casts each layer's inputs to bf16 (the whole forward in bf16, as the rollout engine computes it), so the
sharded trainer's logprobs sit closer to the sampler's (smaller rollout/logprob_diff_mean) by design.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "arithmetic"

CURVE_KEYS = ("loss/policy", "reward/mean", "grad_norm", "entropy", "rollout/logprob_diff_mean")
EXTRA_KEYS = (
    "loss/total",
    "reward/std",
    "rollout/response_len_mean",
    "response_tokens",
    "clipfrac",
    "approx_kl",
    "time/iteration",
    "time/update",
)
SHORT = {
    "loss/policy": "loss",
    "reward/mean": "reward",
    "grad_norm": "grad_norm",
    "entropy": "entropy",
    "rollout/logprob_diff_mean": "lp_diff",
}

# Per device: data, model, SFT warm start and GRPO overrides. CUDA follows examples/arithmetic/run_gpu.sh
# (3-digit addition, 13.0M parameters; its full SFT ends near 89% held-out accuracy: this comparison starts
# from the final weights, not from the checkpoint run_gpu.sh picks, since it compares curves, not learning).
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {
        "data": {"digits": 1, "sft": 60, "train": 30, "val": 10},
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
        "sft_yaml": "sft.yaml",
        "sft": ["epochs=40", "batch_size=16", "tracking.tensorboard=false"],
        "train_yaml": "grpo.yaml",
        "iterations": 4,
        "train": [
            "cluster.device=cpu",
            "cluster.cpus_per_worker=0.5",
            "rollout.engine=reference",
            "rollout.prompts_per_step=4",
            "rollout.samples_per_prompt=4",
            "train.trajectories_per_update=8",  # 2 optimizer steps per iteration, 4 trajectories per rank
            "train.max_tokens_per_micro_batch=256",
        ],
    },
    "cuda": {
        "data": {"digits": 3, "sft": 30000, "train": 20000, "val": 500},
        "model": {"hidden_size": 384, "num_layers": 6, "num_heads": 6, "num_kv_heads": 2},
        "sft_yaml": "sft_gpu.yaml",
        "sft": ["tracking.tensorboard=false", "checkpoint.every=0"],
        "train_yaml": "grpo_gpu.yaml",
        "iterations": 20,
        "train": [
            "cluster.device=cuda",
            "cluster.gpus_per_worker=1",
            "cluster.placement=colocated",
            "rollout.engine=fast",
        ],
    },
}
COMMON_TRAIN = [
    "cluster.backend=ray",
    "val_every=0",  # validate before the first and after the last iteration
    "checkpoint.every=0",
    "tracking.tensorboard=false",
    "tracking.progress=false",
]
RUNS = {  # name -> (trainer ranks, overrides that differ)
    "a": (1, ["cluster.num_trainer_workers=1", "train.sharding=none"]),
    "b": (2, ["cluster.num_trainer_workers=2", "train.sharding=fsdp"]),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Compare the loss curve of 1 trainer rank with 2 FSDP2-sharded ranks (ascent train).",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--out", type=Path, default=None, help="JSON with both curves (default: <workdir>/fsdp_curve.json)."
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="Data, model, SFT and runs (default: runs/fsdp_curve/<device>).",
    )
    p.add_argument("--iterations", type=int, default=None, help="GRPO iterations (default: cpu 4, cuda 20).")
    p.add_argument(
        "--model", type=Path, default=None, help="Start GRPO from this checkpoint (no model making, no SFT)."
    )
    p.add_argument(
        "--data", type=Path, default=None, help="Directory with train.jsonl and val.jsonl (default: made)."
    )
    p.add_argument(
        "--no-sft", action="store_true", help="Skip the SFT warm start (GRPO from the random model)."
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Extra `ascent train` override for both runs (repeatable).",
    )
    p.add_argument(
        "--trainer-compile",
        choices=("off", "auto", "on"),
        default="off",
        help="train.compile for the SFT and both runs, where the config has it (off: saves ~50 s per run "
        "on a GPU; auto: as users run it).",
    )
    p.add_argument("--only", choices=("a", "b"), default=None, help="Run only one of the two (debugging).")
    p.add_argument("--timeout", type=float, default=900.0, help="Seconds allowed per `ascent` command.")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------ subprocesses
def child_env(cuda_devices: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        paths.insert(0, str(ROOT))  # ascent from this checkout, not pip-installed
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if cuda_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_devices
    return env


def run_logged(name: str, cmd: list[str], log: Path, env: dict[str, str], timeout: float) -> float:
    """Run `cmd`, output to `log`; returns wall seconds. On failure print the log's tail and exit."""
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    print(f"[{name}] log: {log}", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=ROOT)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -1
    wall = time.perf_counter() - t0
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        what = f"timed out after {timeout:g} s" if rc == -1 else f"exited {rc}"
        raise SystemExit(f"[{name}] {what} (wall {wall:.0f} s); full log: {log}")
    print(f"[{name}] done in {wall:.1f} s", flush=True)
    return wall


def visible_gpus() -> list[str]:
    """The GPU ids this process may use, in the CUDA_VISIBLE_DEVICES spelling."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [x.strip() for x in listed.split(",") if x.strip()][:count]
    return [str(i) for i in range(count)]


def compile_overrides(setting: str) -> list[str]:
    """`train.compile=<setting>` when this checkout's TrainConfig has that field, else nothing."""
    from ascent.config.schema import TrainConfig  # pydantic only, no torch

    return [f"train.compile={setting}"] if "compile" in TrainConfig.model_fields else []


# ------------------------------------------------------------------------------------------ preparation
def prepare(
    args: argparse.Namespace, preset: dict[str, Any], work: Path, gpu0: str | None
) -> tuple[Path, Path]:
    """-> (model path, data dir): made (and warm-started) once per workdir, or given."""
    sys.path.insert(0, str(EXAMPLE))
    from make_data import make  # examples/arithmetic/make_data.py

    data = args.data
    if data is None:
        data = work / "data"
        if not (data / "train.jsonl").exists():
            make(data, seed=0, **preset["data"])
    if args.model is not None:
        return args.model, data
    base = work / "base"
    if not (base / "config.json").exists():
        from ascent.models.tiny import make_tiny_checkpoint

        make_tiny_checkpoint(base, seed=0, **preset["model"])
    if args.no_sft:
        return base, data
    sft_dir = work / "sft"
    final = sft_dir / "final"
    if (final / "config.json").exists():
        print(f"[sft] reusing {final}", flush=True)
        return final, data
    shutil.rmtree(sft_dir, ignore_errors=True)  # an unfinished warm start of ours
    cmd = [
        sys.executable,
        "-m",
        "ascent",
        "sft",
        str(EXAMPLE / preset["sft_yaml"]),
        f"run_dir={sft_dir}",
        f"model.path={base}",
        f"data.train_path={data / 'sft.jsonl'}",
        "data.val_path=null",
        *preset["sft"],
        *compile_overrides(args.trainer_compile),
    ]
    # `ascent sft` runs inline on `auto`: the first GPU (gpu0) on CUDA, the CPU otherwise
    work.mkdir(parents=True, exist_ok=True)
    run_logged("sft", cmd, work / "sft.log", child_env(gpu0), args.timeout)
    return final, data


def train_command(
    args: argparse.Namespace,
    preset: dict[str, Any],
    run_dir: Path,
    model: Path,
    data: Path,
    differ: list[str],
) -> list[str]:
    iterations = args.iterations or preset["iterations"]
    return [
        sys.executable,
        "-m",
        "ascent",
        "train",
        str(EXAMPLE / preset["train_yaml"]),
        f"run_dir={run_dir}",
        f"model.path={model}",
        f"iterations={iterations}",
        f"data.train_path={data / 'train.jsonl'}",
        f"data.val_path={data / 'val.jsonl'}",
        *COMMON_TRAIN,
        *preset["train"],
        *compile_overrides(args.trainer_compile),
        *args.overrides,
        *differ,
    ]


def read_metrics(run_dir: Path) -> tuple[list[dict[str, float]], dict[str, float], dict[str, float]]:
    """-> (per-iteration rows, validation before, validation after) from <run_dir>/metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    iters = [r for r in rows if "reward/mean" in r]
    val = {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r}
    first, last = min(val, default=0), max(val, default=0)
    nan = float("nan")
    return (
        iters,
        {"step": first, "val/accuracy": val.get(first, nan)},
        {"step": last, "val/accuracy": val.get(last, nan)},
    )


# ------------------------------------------------------------------------------------------ comparison
def compare(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict[str, Any]:
    n = min(len(a), len(b))
    out: dict[str, Any] = {
        "iterations_compared": n,
        "max_abs_diff": {},
        "iter1_abs_diff": {},
        "max_rel_diff": {},
        "mean_a": {},
        "mean_b": {},
    }
    for key in CURVE_KEYS + EXTRA_KEYS:
        pairs = [(x.get(key), y.get(key)) for x, y in zip(a[:n], b[:n], strict=True)]
        diffs = [abs(x - y) for x, y in pairs if x is not None and y is not None]
        rels = [abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in pairs if x is not None and y is not None]
        if diffs:
            out["max_abs_diff"][key] = max(diffs)
            out["iter1_abs_diff"][key] = diffs[0]
            out["max_rel_diff"][key] = max(rels)
            out["mean_a"][key] = statistics.fmean(x for x, _ in pairs if x is not None)
            out["mean_b"][key] = statistics.fmean(y for _, y in pairs if y is not None)
    # the rollout is the same while its statistics are: reward, mean length and token count all equal
    same = [
        all(x.get(k) == y.get(k) for k in ("reward/mean", "rollout/response_len_mean", "response_tokens"))
        for x, y in zip(a[:n], b[:n], strict=True)
    ]
    out["same_rollout_stats"] = same
    out["rollout_diverged_at"] = next((i + 1 for i, s in enumerate(same) if not s), None)
    return out


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3e}" if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e4) else f"{x:.4f}"


def print_table(a: list[dict[str, float]], b: list[dict[str, float]], cmp: dict[str, Any]) -> None:
    head = ["it"] + [f"{SHORT[k]} {s}" for k in CURVE_KEYS for s in ("a", "b")] + ["rollout"]
    rows = []
    for i in range(cmp["iterations_compared"]):
        cells = [str(a[i]["step"])]
        for k in CURVE_KEYS:
            cells += [fmt(a[i].get(k)), fmt(b[i].get(k))]
        cells.append("same" if cmp["same_rollout_stats"][i] else "differs")
        rows.append(cells)
    rows.append(["mean"] + [fmt(cmp[f"mean_{s}"].get(k)) for k in CURVE_KEYS for s in ("a", "b")] + [""])
    rows.append(["max|a-b|"] + [c for k in CURVE_KEYS for c in ("", fmt(cmp["max_abs_diff"].get(k)))] + [""])
    rows.append(
        ["it1|a-b|"] + [c for k in CURVE_KEYS for c in ("", fmt(cmp["iter1_abs_diff"].get(k)))] + [""]
    )
    widths = [max(len(r[j]) for r in [head, *rows]) for j in range(len(head))]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset = PRESETS[args.device]
    work = (args.workdir or ROOT / "runs" / "fsdp_curve" / args.device).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_path = (args.out or work / "fsdp_curve.json").resolve()
    gpus: list[str] = []
    if args.device == "cuda":
        gpus = visible_gpus()
        need = 1 if args.only == "a" else 2
        if len(gpus) < need:
            raise SystemExit(f"--device cuda needs {need} GPUs; this machine shows {len(gpus)}.")
    t_start = time.perf_counter()
    model, data = prepare(args, preset, work, gpus[0] if gpus else None)
    prep_s = time.perf_counter() - t_start

    results: dict[str, Any] = {}
    for name, (ranks, differ) in RUNS.items():
        if args.only and name != args.only:
            continue
        run_dir = work / f"run_{name}"
        # our own previous run of this name: `ascent train` refuses to overwrite a run with checkpoints
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = train_command(args, preset, run_dir, model, data, differ)
        env = child_env(",".join(gpus[:ranks]) if gpus else None)
        wall = run_logged(name, cmd, work / f"train_{name}.log", env, args.timeout)
        iters, val_before, val_after = read_metrics(run_dir)
        results[name] = {
            "trainer_ranks": ranks,
            "sharding": "fsdp" if ranks > 1 else "none",
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES") if gpus else None,
            "command": cmd,
            "wall_s": wall,
            "median_iteration_s": statistics.median(r["time/iteration"] for r in iters) if iters else None,
            "val_before": val_before,
            "val_after": val_after,
            "curve": {k: [r.get(k) for r in iters] for k in ("step", *CURVE_KEYS, *EXTRA_KEYS)},
            "metrics": iters,
        }

    report: dict[str, Any] = {
        "device": args.device,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "model": str(model),
        "data": str(data),
        "prepare_s": prep_s,
        "runs": results,
    }
    print()
    print(f"model {model}  data {data}  (prepare {prep_s:.0f} s)")
    if "a" in results and "b" in results:
        a, b = results["a"]["metrics"], results["b"]["metrics"]
        cmp = compare(a, b)
        report["comparison"] = cmp
        print("a: 1 trainer rank (sharding none), b: 2 trainer ranks (train.sharding=fsdp); both backend=ray")
        print_table(a, b, cmp)
        print()
        div = cmp["rollout_diverged_at"]
        same1 = "equal" if cmp["same_rollout_stats"][:1] == [True] else "NOT equal"
        print(
            "Iteration 1 samples identical trajectories in a and b (same seed, engine and starting weights): "
            f"its rollout statistics are {same1}, so its differences are the trainer's alone."
        )
        if div is None:
            print(f"The rollouts stayed identical through all {cmp['iterations_compared']} iterations.")
        else:
            print(
                f"From iteration {div} the two runs sample different tokens (the updated weights differ by "
                "rounding), so later differences include sampling noise: compare trends there, not digits."
            )
        if args.device == "cuda" or any(o.replace(" ", "") == "model.dtype=bf16" for o in args.overrides):
            print(
                "bf16: a computes under autocast over fp32 weights, b (FSDP2 mixed precision) in bf16 "
                "throughout, like the sampler: expect a smaller lp_diff in b and differences beyond rounding."
            )
        for key in ("loss/total", "rollout/response_len_mean"):
            if key in cmp["max_abs_diff"]:
                print(f"max|a-b| {key}: {fmt(cmp['max_abs_diff'][key])}")
    for name, r in results.items():
        print(
            f"run {name}: {r['trainer_ranks']} trainer rank(s), wall {r['wall_s']:.1f} s, median iteration "
            f"{fmt(r['median_iteration_s'])} s, val/accuracy {fmt(r['val_before']['val/accuracy'])} -> "
            f"{fmt(r['val_after']['val/accuracy'])}"
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
