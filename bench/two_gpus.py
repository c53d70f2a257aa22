r"""Issue #12's two-GPU evidence: GRPO on 1 GPU against 2 GPUs (colocated FSDP, split async), weight
publication over NCCL broadcast, and a Qwen2.5-7B-shape iteration on 2 GPUs, each through `ascent train`.

    python3 bench/two_gpus.py --mode one_gpu,colocated2,split_async2 --json $OUT/a.json --logs $OUT/logs
    python3 bench/two_gpus.py --mode one_gpu --device cpu --shape tiny          # CPU smoke test (~30 s)
    python3 bench/two_gpus.py --estimate                                        # doctor's memory estimates

Device commands (a machine of 2 GPUs on one host: `run` with kind nvidia-h200-x2 or nvidia-h100-x2, carry
[".whl"], timeout_s 600; each fits one 10-minute call: the budget guard SIGTERMs a mode --stop-grace-s (45)
before --budget-s ends, `ascent train` stops after the iteration in progress, and a mode that would start
with too little time left is skipped), each after the same set-up:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \
        export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH && ...

    ... nvidia-smi topo -m && python3 bench/two_gpus.py --mode one_gpu,colocated2,split_async2 \
        --budget-s 550 --json $OUT/gpu2.json --logs $OUT/logs 2>&1 | tail -120
    ... python3 bench/two_gpus.py --mode publish --budget-s 550 --json $OUT/publish.json \
        --logs $OUT/logs 2>&1 | tail -40
    ... python3 bench/two_gpus.py --mode seven_b --budget-s 550 --json $OUT/seven_b.json \
        --logs $OUT/logs 2>&1 | tail -60

Calls 4 and 5, the async learning run (`bench/async_learning.sh`: the arithmetic warm start, then GRPO at
max_staleness 0 and 1 on Ray split with a GPU each), on the same warm machine (runs/ survives between calls):

    STAGE=warm bash bench/async_learning.sh runs/al 2>&1 | tail -5
    STAGE=grpo GPUS_PER_WORKER=1 bash bench/async_learning.sh runs/al 150 2>&1 | tail -20

(Fill .whl/ first, here: `bash ../shared/gpu/wheels.sh` from the checkout's root: Ray 2.60 and pydantic.)
Each child's log, and each run's metrics.jsonl, config.yaml and process logs, land in $OUT/logs.

Call 1 runs the 1.5B modes in the same call, so their ratio compares like with like; expected about 2-2.5
minutes each (checkpoint 20 s once, Ray and model start 30-40 s, trainer compile and CUDA graphs 40-60 s,
6 iterations of 5-9 s). A mode that gets no timed iteration goes into call 2 (`--mode split_async2,publish`);
`--compare a.json b.json` prints one comparison table from several calls' JSON (same machine kind only).
Call 2: 1.5B (6.2 GB fp32 sent) and 7B (30.5 GB) publications, 5 each; writing the 7B checkpoint takes
about 1.5 minutes, group start-up 30-90 s per shape. Call 3 reuses the 7B checkpoint if the machine is still
the same, else writes it again.

Modes (all `ascent.entrypoints.train.run_training` on a generated RunConfig in a child process, except
`publish`; random-weight Qwen2.5 shapes, char tokenizer, coin-flip reward: bench/e2e_workload.py):
- one_gpu: today's colocated loop, `cluster.backend=inline`, fast engine, one GPU.
- colocated2: Ray, `cluster.placement=colocated`, 2 trainer ranks (`train.sharding=fsdp`) and 2 replicas,
  one of each per GPU (`gpus_per_worker=1`: 0.5 each), weights over CUDA IPC (`auto`).
- split_async2: Ray, `cluster.placement=split`, 1 trainer GPU + 1 engine GPU, `rollout.max_staleness=1`,
  weights over NCCL broadcast (`auto`), publications land mid-generation (`swap_mid_generation=continue`).
- overlap1 / overlap2: Ray colocated on 1 / 2 GPUs (2: FSDP over 2 ranks) with the engine kept awake
  (`cluster.engine_sleeps=false`) and `rollout.max_staleness=1`: each replica generates the next iteration
  on its GPU while the trainer rank beside it updates; publications over CUDA IPC land between decode steps.
- colocated4 / overlap4: colocated2 / overlap2 on four GPUs of one host (kind nvidia-h100-x4 or h200-x4),
  the same workload, so the ratio to one_gpu (same call) is the strong-scaling figure of issue #31.
- publish: bench/publish.py's `measure` with `--placement split --transports broadcast` (1.5B and 7B).
- seven_b: the 7B shape like colocated2 (FSDP over 2 ranks, gradient checkpointing), with
  `train.offload_optimizer` (`--offload-optimizer auto`), a smaller workload (16x8, 256 new tokens).
Workloads: 1.5B as bench/e2e.py (32 prompts x 8, 256-token prompts, 512 new tokens, one optimizer step,
24576-token micro-batches, 2048-row logprob chunks), 2 warm-up + 4 timed iterations; 7B 16x8, 256 new
tokens, 16384-token micro-batches, 1 + 3. The engine's `gpu_memory_fraction` is sized to its share of the
workload (KV +10%, weights, activation reserve). The run's final checkpoint is skipped (not measured here).

Memory per GPU (`--estimate`: `ascent doctor`'s terms at 79.6 GiB, an H100; allocated, without the ~10%
allocator fragmentation and CUDA contexts that "needs" adds):
- one_gpu 31.0 GiB at peak (update), needs 34.6; split_async2 the same on the trainer GPU, 11.5 on the
  engine GPU; colocated2 20.1 (needs 22.6), 28.3 as two processes (below).
- seven_b with `train.offload_optimizer`: 42.8 GiB (update), needs 47.6; 61.4 GiB as two processes: fits an
  H100. AdamW's moments and the fp32 masters go to pinned CPU memory: 56.7 GiB per rank, 113 of the host's
  256 GiB. Without offload 71.2 (needs 78.8), 89.8 as two processes: not on an H100; on an H200 try
  `--offload-optimizer off`.
- "As two processes": on Ray, colocated, trainer and engine are separate processes; the upper bound if the
  trainer's caching allocator kept its update's memory while the engine wakes. The loop now asks the
  trainer's ranks to release their cached blocks before the wake (`memory/trainer_released_gib`), so the
  one-process figure should hold; the nvidia-smi peaks of colocated2/seven_b test this.

Reported per mode: median and range of every phase after warm-up (time/iteration, rollout, generate,
reward, logprobs, update, publish, trainer_idle: the trainer waiting on generation, engine_idle: the engine
waiting for work), completions/s from the wall clock between iterations and from the median iteration, peak
GPU memory used per GPU (nvidia-smi, every 0.5 s: all processes, reserved memory and CUDA contexts
included) and mean utilisation, the doctor's estimate; with several modes a comparison table (ratio to
one_gpu's completions/s; goal: 2 GPUs >= 1.8x). On CPU (`--device cpu`): reference engine, gloo, fp32,
`gpus_per_worker=0`, a private local Ray cluster per mode (`ray.init` with `num_cpus`), no memory figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_workload as W  # noqa: E402
import two_gpus_report as R  # noqa: E402
from two_gpus_modes import (  # noqa: E402
    GIB,
    LAYOUTS,
    MODES,
    TRAIN_MODES,
    Workload,
    cpus_per_worker,
    gpu_bytes,
    model_shape,
    offload,
    run_config,
    shapes_of,
    workload,
)


# ------------------------------------------------------------------------------------------------ child
def child_prepare(args: argparse.Namespace, shape: str) -> None:
    """Write (once) the checkpoint of `shape` and the prompts its workload reads (its own process: the CUDA
    context it makes for the random init goes away before a mode runs)."""
    Path(args.root).mkdir(parents=True, exist_ok=True)
    W.make_checkpoint(args.root, shape, args.device)
    wl = workload(args, shape)
    W.write_prompts(args.root, 256, wl.prompt_len)
    W.write_prompts(args.root, 16, 32)  # bench/publish.py's prompts


def child_train(args: argparse.Namespace, mode: str) -> None:
    """One training mode through `run_training`; the final checkpoint is skipped (its write is not measured
    and at 7B takes minutes and tens of GB)."""
    from ascent.entrypoints.train import run_training
    from ascent.orchestrator import checkpointing
    from ascent.orchestrator.interrupt import Interrupted
    from ascent.rewards.registry import REWARD_FUNCTIONS

    REWARD_FUNCTIONS["bench_coin"] = W.coin_reward
    cfg = run_config(args, mode, shapes_of(args, mode)[0])
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    checkpointing.save = lambda run, state, it: None  # type: ignore[assignment,return-value]
    if cfg.cluster.backend == "ray":
        from ascent.cluster import init_ray

        init_ray(None, cfg.cluster.num_cpus, log_to_driver=False)  # a private local cluster
    try:
        run_training(cfg)
    except Interrupted as e:  # the budget guard's SIGTERM: the iterations so far are in metrics.jsonl
        print(f"{mode}: {e}", flush=True)
        raise SystemExit(e.exit_code) from None
    finally:
        if cfg.cluster.backend == "ray":
            import ray

            ray.shutdown()


def child_publish(args: argparse.Namespace) -> None:
    """bench/publish.py's `measure` over `broadcast`, split placement, per shape; rows to
    <root>/publish.json."""
    import publish

    from ascent.cluster import init_ray

    cuda = args.device == "cuda"
    init_ray(None, None if cuda else 4, log_to_driver=False)
    ns = SimpleNamespace(
        placement="split",
        device=args.device,
        engine_fraction=0.5,
        gpus_per_worker=1.0,
        cpus_per_worker=cpus_per_worker(args),
        bucket_mb=args.bucket_mb,
        repeats=args.publish_repeats,
        root=args.root,
    )
    rows: list[dict[str, Any]] = []
    out = Path(args.root) / "publish.json"
    out.unlink(missing_ok=True)
    data = Path(args.root) / "prompts_32.jsonl"
    for shape in shapes_of(args, "publish"):
        row = publish.measure(
            ns,  # type: ignore[arg-type]
            Path(args.root) / f"model_{shape}",
            data,
            "broadcast",
        )
        rows.append(
            {"shape": shape, "params": W.num_params(shape), "bytes_sent": 4 * W.num_params(shape), **row}
        )
        out.write_text(json.dumps(rows, indent=1))
        print(json.dumps(rows[-1]), flush=True)


# ----------------------------------------------------------------------------------------------- parent
def run_child(args: argparse.Namespace, what: list[str], log: Path, deadline: float) -> tuple[int, float]:
    """`two_gpus.py --child ...` in its own session, output to `log`. At `deadline - --stop-grace-s`: SIGTERM
    (ascent stops after the iteration in progress), at `deadline` SIGKILL to its process group. -> (rc, s)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args.argv, "--child", *what]
    t0 = time.time()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(deadline - args.stop_grace_s - t0, 1))
        except subprocess.TimeoutExpired:
            print(
                f"  {' '.join(what)}: out of budget after {time.time() - t0:.0f} s; stopping it", flush=True
            )
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=max(deadline - time.time(), 5))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    wall = time.time() - t0
    if rc != 0:
        print(f"  {' '.join(what)}: rc {rc}; last lines of {log}:", flush=True)
        print("\n".join(log.read_text(errors="replace").splitlines()[-25:]), flush=True)
    return rc, wall


def doctor_estimate(cfg: Any, shape: str, total: int) -> dict[str, Any]:
    """`ascent doctor`'s memory estimate per GPU. On Ray, colocated, the trainer and the engine are two
    processes: the trainer's allocator keeps its update's memory cached while the engine wakes, so the GPU
    holds both (`two_process_gib`), where the doctor counts phases that take turns in one process."""
    from ascent.doctor import plan
    from ascent.doctor.memory import engine_terms

    m, est = plan.run_estimate(cfg, model_shape(shape), total, 1)
    out = {
        "peak_gib": est.peak / GIB,
        "peak_phase": est.peak_phase(),
        "needed_gib": est.needed() / GIB,
        "host_gib": est.host_bytes / GIB,
        "phases_gib": {p: est.total(p) / GIB for p in est.phases},
    }
    c = cfg.cluster
    if c.backend == "ray" and c.placement == "colocated" and "update" in est.phases:
        out["two_process_gib"] = (est.total("update") + sum(engine_terms(m).values())) / GIB
    return out


def measure_train(args: argparse.Namespace, mode: str, deadline: float) -> dict[str, Any]:
    """Run one training mode in a child while sampling the GPUs; summarise its metrics.jsonl."""
    from ascent.orchestrator.setup import weight_transport_kind
    from ascent.tracking.metrics import read_metrics

    shape, lay = shapes_of(args, mode)[0], LAYOUTS[mode]
    wl, cfg = workload(args, shape), run_config(args, mode, shape)
    sections = cfg.model_dump(mode="json", include={"rollout", "train", "cluster", "model"})
    res: dict[str, Any] = {
        "mode": mode,
        "layout": lay.text,
        "gpus": lay.gpus,
        "shape": shape,
        "workload": asdict(wl),
        "transport": weight_transport_kind(cfg),
        "config": sections,
    }
    if args.device == "cuda":
        res["doctor_estimate"] = doctor_estimate(cfg, shape, gpu_bytes(args))
    sampler = R.GpuSampler()
    t0 = time.time()
    res["rc"], res["child_wall_s"] = run_child(args, [mode], Path(args.logs) / f"{mode}.log", deadline)
    sampler.stop()
    keep_run_files(cfg.run_dir, Path(args.logs) / mode)
    res["summary"] = R.summarize(read_metrics(cfg.run_dir), wl.warmup, wl.prompts * wl.samples)
    res["gpus_run"] = sampler.window(t0, time.time())
    if "timed_window" in res["summary"]:
        res["gpus_timed"] = sampler.window(*res["summary"]["timed_window"])
    return res


def keep_run_files(run_dir: str, dest: Path) -> None:
    """Copy the run's small records (metrics.jsonl, config.yaml, status.json, trace.json, every process's
    log) next to the children's logs, so they come back from the device with them."""
    src = Path(run_dir)
    dest.mkdir(parents=True, exist_ok=True)
    records = ["metrics.jsonl", "config.yaml", "status.json", "trace.json"]
    for path in [*(src / name for name in records), *src.glob("logs/*.log")]:
        if path.is_file():
            shutil.copy2(path, dest / path.name)


def measure_publish(args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    sampler = R.GpuSampler()
    t0 = time.time()
    rc, wall = run_child(args, ["publish"], Path(args.logs) / "publish.log", deadline)
    sampler.stop()
    out = Path(args.root) / "publish.json"
    rows = json.loads(out.read_text()) if out.exists() else []
    return {
        "mode": "publish",
        "rc": rc,
        "child_wall_s": wall,
        "rows": rows,
        "gpus_run": sampler.window(t0, None),
    }


def run_modes(args: argparse.Namespace, modes: list[str]) -> list[dict[str, Any]]:
    deadline = time.time() + args.budget_s
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for mode in modes:
        for shape in shapes_of(args, mode):
            print(f"[{mode}] preparing shape {shape} under {args.root}", flush=True)
            rc, _ = run_child(args, ["prepare", shape], Path(args.logs) / f"prepare_{shape}.log", deadline)
            if rc != 0:
                raise SystemExit(f"preparing {shape} failed (rc {rc})")
        left = deadline - time.time()
        if left < args.stop_grace_s + 30:
            print(f"[{mode}] skipped: {left:.0f} s of budget left; run it in another call", flush=True)
            continue
        print(f"[{mode}] running ({left:.0f} s of budget left)", flush=True)
        res = measure_publish(args, deadline) if mode == "publish" else measure_train(args, mode, deadline)
        results.append(res)
        print(report(res), flush=True)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(
                json.dumps({"facts": R.facts(args), "results": results}, indent=1, default=str)
            )
    return results


def report(res: dict[str, Any]) -> str:
    if res["mode"] != "publish":
        return R.mode_table(res)
    head = (
        f"== publish: split placement, NCCL/gloo broadcast, rc {res['rc']}, wall {res['child_wall_s']:.0f} s"
    )
    return head + "\n" + (R.publish_table(res["rows"]) if res["rows"] else "no publication measured")


def print_estimates(args: argparse.Namespace) -> None:
    """The doctor's per-GPU memory estimate of every training mode at --gpu-gib (nothing is run)."""
    total = int(args.gpu_gib * GIB)
    args.device = "cuda"
    for mode in TRAIN_MODES:
        shape = shapes_of(args, mode)[0]
        est = doctor_estimate(run_config(args, mode, shape), shape, total)
        phases = ", ".join(f"{p} {g:.1f}" for p, g in est["phases_gib"].items())
        two = f"; as two processes {est['two_process_gib']:.1f} GiB" if "two_process_gib" in est else ""
        print(
            f"{mode} ({shape}, offload {offload(args, mode)}): peak {est['peak_gib']:.1f} GiB "
            f"({est['peak_phase']}), needs {est['needed_gib']:.1f} of {args.gpu_gib} GiB{two}; host "
            f"{est['host_gib']:.1f} GiB; "
            f"phases: {phases}"
        )


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--mode", default="one_gpu,colocated2,split_async2", help=f"comma list of {', '.join(MODES)}"
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--shape", choices=sorted(W.SHAPES), default=None, help="every mode's shape (tiny on CPU)"
    )
    ap.add_argument("--publish-shapes", default="1.5b,7b")
    ap.add_argument("--publish-repeats", type=int, default=5)
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument(
        "--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA, fp32 on CPU"
    )
    for name in Workload.__dataclass_fields__:
        ap.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=int, default=None, help="workload override"
        )
    ap.add_argument(
        "--offload-optimizer", choices=["auto", "on", "off"], default="auto", help="auto: seven_b only"
    )
    ap.add_argument("--trainer-compile", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--keep-head-logits", action="store_true", help="train.keep_head_logits=true")
    ap.add_argument(
        "--mps",
        choices=["auto", "on", "off"],
        default="auto",
        help="cluster.mps (overlap modes: MPS or time slices)",
    )
    ap.add_argument(
        "--grad-ckpt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="model.gradient_checkpointing (pair --no-grad-ckpt with a smaller --micro-batch-tokens)",
    )
    ap.add_argument("--cpus-per-worker", type=float, default=None, help="default: 6 on CUDA, 0.5 on CPU")
    ap.add_argument("--budget-s", type=float, default=560.0, help="wall seconds for all modes of this call")
    ap.add_argument(
        "--stop-grace-s", type=float, default=45.0, help="SIGTERM this long before the budget ends"
    )
    ap.add_argument("--gpu-gib", type=float, default=79.6, help="GPU size for --estimate without a GPU")
    ap.add_argument("--estimate", action="store_true", help="print the doctor's estimates and exit")
    ap.add_argument("--compare", nargs="+", default=None, help="JSON files of earlier calls: one table")
    ap.add_argument("--root", default="/tmp/ascent_two_gpus")
    ap.add_argument("--logs", default=None, help="children's logs (default: <root>/logs)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = [a for a in argv]
    args.logs = args.logs or str(Path(args.root) / "logs")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.child:
        what = args.child[0]
        if what == "prepare":
            child_prepare(args, args.child[1])
        elif what == "publish":
            child_publish(args)
        else:
            child_train(args, what)
        return []
    if args.estimate:
        print_estimates(args)
        return []
    if args.compare:
        results = [r for path in args.compare for r in json.loads(Path(path).read_text())["results"]]
    else:
        modes = args.mode.split(",")
        unknown = [m for m in modes if m not in MODES]
        if unknown:
            raise SystemExit(f"--mode {args.mode}: unknown {unknown}; choose from {', '.join(MODES)}")
        results = run_modes(args, modes)
    trains = [r for r in results if r["mode"] != "publish"]
    if len(trains) > 1 or args.compare:
        print(
            "== comparison (completions/s from the wall clock of the timed iterations)\n"
            + R.compare_table(trains)
        )
    return results


if __name__ == "__main__":
    main()
