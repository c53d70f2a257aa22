"""What each mode of bench/two_gpus.py runs: the worker layouts, the workloads of the model shapes, and the
`RunConfig` a training mode builds from them (pure functions of the command line's arguments; nothing here
starts a process). Kept apart from two_gpus.py, which runs the modes and measures them, for size.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_workload as W  # noqa: E402

TRAIN_MODES = (
    "one_gpu",
    "one_gpu_awake",
    "colocated2",
    "split_async2",
    "seven_b",
    "overlap1",
    "overlap2",
    "colocated4",
    "overlap4",
    "awake2",
    "awake4",
)
MODES = (*TRAIN_MODES, "publish")
GIB = 2**30


@dataclass(frozen=True)
class Layout:
    """Where a mode's workers go."""

    backend: str
    placement: str
    trainers: int
    replicas: int
    staleness: int
    sharding: str
    gpus: int
    text: str
    engine_sleeps: bool = True


LAYOUTS = {
    "one_gpu": Layout("inline", "colocated", 1, 1, 0, "none", 1, "inline, trainer + engine on 1 GPU"),
    "one_gpu_awake": Layout(
        "inline", "colocated", 1, 1, 0, "none", 1, "inline, engine awake through the update", False
    ),
    "colocated2": Layout("ray", "colocated", 2, 2, 0, "fsdp", 2, "Ray colocated, 2 FSDP ranks + 2 replicas"),
    "split_async2": Layout(
        "ray", "split", 1, 1, 1, "none", 2, "Ray split, trainer GPU + engine GPU, staleness 1"
    ),
    "seven_b": Layout("ray", "colocated", 2, 2, 0, "fsdp", 2, "Ray colocated, 2 FSDP ranks + 2 replicas"),
    "overlap1": Layout(
        "ray", "colocated", 1, 1, 1, "none", 1, "Ray colocated, engine awake, staleness 1", False
    ),
    "overlap2": Layout(
        "ray", "colocated", 2, 2, 1, "fsdp", 2, "Ray colocated x2, engine awake, staleness 1", False
    ),
    # four GPUs of one host (nvidia-h100-x4 / h200-x4): the same workload spread over four ranks
    "colocated4": Layout("ray", "colocated", 4, 4, 0, "fsdp", 4, "Ray colocated, 4 FSDP ranks + 4 replicas"),
    "overlap4": Layout(
        "ray", "colocated", 4, 4, 1, "fsdp", 4, "Ray colocated x4, engine awake, staleness 1", False
    ),
    # generation and update in turn (staleness 0) with the engines kept awake: no sleep, wake or recapture
    "awake2": Layout(
        "ray", "colocated", 2, 2, 0, "fsdp", 2, "Ray colocated x2, engine awake, staleness 0", False
    ),
    "awake4": Layout(
        "ray", "colocated", 4, 4, 0, "fsdp", 4, "Ray colocated x4, engine awake, staleness 0", False
    ),
}


@dataclass(frozen=True)
class Workload:
    prompts: int
    samples: int
    prompt_len: int
    new_tokens: int
    micro_batch_tokens: int
    logprob_chunk: int
    warmup: int
    iterations: int


WORKLOADS = {
    "1.5b": Workload(32, 8, 256, 512, 24576, 2048, 2, 4),
    "7b": Workload(16, 8, 256, 256, 16384, 1024, 1, 3),
    "cpu": Workload(4, 2, 16, 8, 512, 256, 1, 2),
}


def shapes_of(args: argparse.Namespace, mode: str) -> list[str]:
    if args.shape:
        return [args.shape]
    return {"seven_b": ["7b"], "publish": args.publish_shapes.split(",")}.get(mode, ["1.5b"])


def workload(args: argparse.Namespace, shape: str) -> Workload:
    """The preset of the shape (CPU: the tiny preset), with the command line's overrides."""
    base = WORKLOADS["cpu" if args.device == "cpu" else "7b" if shape == "7b" else "1.5b"]
    given = {f: getattr(args, f) for f in Workload.__dataclass_fields__ if getattr(args, f) is not None}
    return replace(base, **given)


def model_shape(shape: str) -> Any:
    """The doctor's ModelShape of a bench shape, from its config alone (no checkpoint needed)."""
    from ascent.doctor.model import model_shape as from_config

    return from_config(W.qwen_config(shape), W.num_params(shape))


def gpu_bytes(args: argparse.Namespace) -> int:
    """Memory of GPU 0 (nvidia-smi, so the parent holds no CUDA context); --gpu-gib without one."""
    exe = shutil.which("nvidia-smi")
    if exe and args.device == "cuda":
        out = subprocess.run(
            [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(float(out.split()[0]) * 2**20)
    return int(args.gpu_gib * GIB)


def engine_fraction(shape: str, wl: Workload, replicas: int, total: int) -> float:
    """rollout.gpu_memory_fraction for one replica: KV of its share of the workload (+10%, +1 GiB), its
    weights and its activation reserve (the doctor's terms, which mirror `build_fast_engine`)."""
    from ascent.doctor.memory import MemoryInputs, engine_reserve_bytes, engine_weight_bytes

    m = MemoryInputs(shape=model_shape(shape), compute_bytes=2)
    rows = -(-wl.prompts * wl.samples // replicas)
    kv = 1.1 * rows * (wl.prompt_len + wl.new_tokens) * m.shape.kv_bytes_per_token(2) + GIB
    return round(min(0.9, (kv + engine_weight_bytes(m) + engine_reserve_bytes(m)) / total), 3)


def offload(args: argparse.Namespace, mode: str) -> bool:
    return args.offload_optimizer == "on" or (args.offload_optimizer == "auto" and mode == "seven_b")


def run_config(args: argparse.Namespace, mode: str, shape: str) -> Any:
    """The RunConfig of a training mode (pure: no files read or written)."""
    from ascent.config.schema import RunConfig

    lay, wl, cuda = LAYOUTS[mode], workload(args, shape), args.device == "cuda"
    ray = lay.backend == "ray"
    fraction = engine_fraction(shape, wl, lay.replicas, gpu_bytes(args)) if cuda else 0.5
    workers = lay.trainers + lay.replicas
    return RunConfig.model_validate(
        {
            "run_dir": str(Path(args.root) / f"run_{mode}_{shape}"),
            "iterations": wl.warmup + wl.iterations,
            "seed": 0,
            "val_every": 0,
            "model": {
                "path": str(Path(args.root) / f"model_{shape}"),
                "dtype": args.dtype or ("bf16" if cuda else "fp32"),
                "gradient_checkpointing": args.grad_ckpt,
            },
            "data": {
                "train_path": str(prompts_path(args, wl)),
                "max_prompt_tokens": wl.prompt_len,
                "chat_template": False,
            },
            "rollout": {
                "engine": "fast" if cuda else "reference",
                "prompts_per_step": wl.prompts,
                "samples_per_prompt": wl.samples,
                "max_new_tokens": wl.new_tokens,
                "temperature": 1.0,
                "max_staleness": lay.staleness,
                "gpu_memory_fraction": fraction,
            },
            "reward": {"fn": "bench_coin", "isolation": "inline"},  # registered in the child (child_train)
            "train": {
                "lr": 1e-6,
                "trajectories_per_update": wl.prompts * wl.samples,
                "max_tokens_per_micro_batch": wl.micro_batch_tokens,
                "logprob_chunk_tokens": wl.logprob_chunk,
                "keep_head_logits": args.keep_head_logits,
                "compile": args.trainer_compile,
                "sharding": lay.sharding,
                "offload_optimizer": offload(args, mode),
            },
            "cluster": {
                "device": args.device,
                "backend": lay.backend,
                "placement": lay.placement,
                "engine_sleeps": lay.engine_sleeps,
                "mps": args.mps,
                "num_trainer_workers": lay.trainers,
                "num_rollout_workers": lay.replicas,
                "gpus_per_worker": 1.0 if cuda and ray else 0.0,
                "cpus_per_worker": cpus_per_worker(args),
                **({"num_cpus": max(2, int(workers * cpus_per_worker(args) + 0.999))} if not cuda else {}),
            },
            "checkpoint": {"save_optimizer": False, "on_interrupt": False},
            "tracking": {"tensorboard": False, "progress": False},
        }
    )


def cpus_per_worker(args: argparse.Namespace) -> float:
    return args.cpus_per_worker or (6.0 if args.device == "cuda" else 0.5)


def prompts_path(args: argparse.Namespace, wl: Workload) -> Path:
    return Path(args.root) / f"prompts_{wl.prompt_len}.jsonl"
