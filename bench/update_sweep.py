r"""The policy update alone, timed across trainer variants and micro-batch settings in ONE process.

    python bench/update_sweep.py --shape 0.5b --settings 16384/1024 24576/2048 \
        --variants base head head+offsets

The e2e bench (bench/e2e.py) pays ~65 s of compilation per run; this one builds one PolicyWorker (bf16
autocast over fp32 master weights, gradient checkpointing, compiled layers, varlen attention: what
`ascent train` builds on a GPU) and times `update` on the e2e workload's trajectories (by default 256 x
(256 + 512) random tokens, one optimizer step) for every variant x setting, so the numbers share a process, a
GPU and a compile cache. Per cell: median update seconds, 6ND MFU, peak allocated / reserved GiB (weights,
grads and AdamW included), and with --profile the GPU kernel seconds of one more update (wall - kernels = time
the GPU waited for the host).

Variants switch one thing each (the default trainer is `head+offsets`):
- `head`: the LM head as one autograd function (`ascent.trainer.head`); without it, the per-chunk
  checkpointed compiled path.
- `offsets`: varlen attention gets the packer's sequence offsets (a compiled layer is one graph); without
  it, the offsets are read off position_ids (a host sync per forward, a graph break per layer).
- `nogc`: Python's cyclic garbage collector paused during the update.
- `cold`: the CUDA allocator's cache emptied before each update (as the colocated engine's sleep does).
- `hostsync`: micro-batches copied to the GPU with blocking copies (the packer before asynchronous ones:
  the GPU waits while the host packs the next micro-batch).
- `inductorgrad`: the head's logits gradient as inductor's kernels, not `ascent.trainer.triton_head`'s.
- `keeplogits`: the head keeps each chunk's logits from the forward for the backward
  (`train.keep_head_logits`) instead of recomputing them: one head matmul fewer, [response tokens,
  vocabulary] more memory per micro-batch.
- `repeatkv`: grouped-query K/V repeated per query head before torch 2.11's varlen kernel (the path before
  `ascent.models.varlen.NATIVE_GQA`), not handed to flash attention with their own heads.
- `inductorstats`: the head's forward stats (logsumexp, entropy, the kept cast) as inductor's two reductions,
  not one Triton pass per row (`ascent.trainer.triton_head.chunk_stats_triton`, `head.TRITON_STATS`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_profile as P  # noqa: E402
import e2e_workload as W  # noqa: E402

NOMINAL_PEAK = 790e12


def make_samples(n: int, prompt_len: int, new_tokens: int, vocab: int, seed: int = 0) -> list[Any]:
    """n trajectories of random tokens with +-1 advantages and sampler logprobs, as a rollout gives them."""
    from ascent.messages import TrainSample

    rng = random.Random(seed)
    return [
        TrainSample(
            prompt_ids=[rng.randrange(4, vocab) for _ in range(prompt_len)],
            response_ids=[rng.randrange(4, vocab) for _ in range(new_tokens)],
            loss_mask=[1] * new_tokens,
            advantages=[rng.choice((-1.0, 1.0))] * new_tokens,
            sampler_logprobs=[-rng.uniform(0.5, 12.0) for _ in range(new_tokens)],
        )
        for _ in range(n)
    ]


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Switch the trainer to `name` (see module doc) inside the block."""
    import ascent.models.varlen as V
    import ascent.trainer.head as Hd
    import ascent.trainer.logprobs as L
    import ascent.trainer.policy as Pol

    parts = set(name.split("+")) - {"base"}
    unknown = parts - {
        "head",
        "offsets",
        "nogc",
        "cold",
        "hostsync",
        "inductorgrad",
        "keeplogits",
        "repeatkv",
        "inductorstats",
    }
    if unknown:
        raise SystemExit(
            f"--variants: unknown part(s) {sorted(unknown)}; use base, head, offsets, nogc, cold, "
            "hostsync, inductorgrad, keeplogits, repeatkv, inductorstats."
        )
    saved = (L.fusable_head, Pol.pack, Hd.TRITON_LOGITS_GRAD, V.NATIVE_GQA, Hd.TRITON_STATS)
    V.NATIVE_GQA = "repeatkv" not in parts
    Hd.TRITON_STATS = "inductorstats" not in parts
    inner = _blocking_pack if "hostsync" in parts else saved[1]
    if "head" not in parts:
        L.fusable_head = lambda head: False  # type: ignore[assignment]
    Hd.TRITON_LOGITS_GRAD = "inductorgrad" not in parts

    def pack(*args: Any, **kwargs: Any) -> Any:
        packed = inner(*args, **kwargs)
        if "offsets" not in parts:
            packed.cu_seqlens = None
        return packed

    Pol.pack = pack  # type: ignore[assignment]
    if "nogc" in parts:
        gc.collect()
        gc.disable()
    try:
        yield
    finally:
        L.fusable_head, Pol.pack, Hd.TRITON_LOGITS_GRAD, V.NATIVE_GQA, Hd.TRITON_STATS = saved  # type: ignore[assignment]
        gc.enable()


def _blocking_pack(samples: Any, device: Any = "cpu") -> Any:
    """The packer before asynchronous copies: every tensor copied to the device with a blocking copy."""
    import dataclasses

    import ascent.trainer.packing as Pk

    batch = Pk._pack_on_host(samples)
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return dataclasses.replace(batch, **moved)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_update(worker: Any, samples: list[Any], cold: bool = False) -> float:
    from ascent.trainer import minibatch_totals

    tokens, seqs = minibatch_totals(samples)
    if cold and torch.cuda.is_available():
        torch.cuda.empty_cache()
    _sync()
    t0 = time.perf_counter()
    worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    _sync()
    return time.perf_counter() - t0


def _peaks() -> tuple[float, float]:
    if not torch.cuda.is_available():
        return 0.0, 0.0
    return torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30


def run_cell(worker: Any, samples: list[Any], args: argparse.Namespace, name: str, setting: str) -> dict:
    tokens, chunk = (int(x) for x in setting.split("/"))
    worker.max_tokens, worker.chunk_tokens = tokens, chunk
    worker.keep_head_logits = "keeplogits" in name.split("+")
    with variant(name):
        warm = timed_update(worker, samples)  # recompiles for a new shape or path land here
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        cold = "cold" in name.split("+")
        times = [timed_update(worker, samples, cold) for _ in range(args.reps)]
        row: dict[str, Any] = {"variant": name, "setting": setting, "warmup_s": warm, "times_s": times}
        row["peak_alloc_gib"], row["peak_reserved_gib"] = _peaks()
        if args.profile:
            out: dict[str, Any] = {}
            with P.profiled_methods(worker, ("update",), out):
                timed_update(worker, samples)
            row["kernel_s"] = out["kernel_s"]
            row["categories_s"] = out["categories_s"]
            row["top_kernels_s"] = out["top_kernels_s"]
    row["update_s"] = statistics.median(times)
    flops = 6 * W.num_params(args.shape) * sum(s.num_tokens for s in samples)
    row["mfu_nominal"] = flops / row["update_s"] / NOMINAL_PEAK
    row["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    return row


def line(r: dict) -> str:
    kern = (
        f"  kernels {r['kernel_s']:.2f} s (GPU idle {1 - r['kernel_s'] / r['update_s']:.0%})"
        if "kernel_s" in r
        else ""
    )
    return (
        f"{r['variant']:>18} {r['setting']:>11}: update {r['update_s']:.2f} s (runs "
        f"{', '.join(f'{t:.2f}' for t in r['times_s'])}), MFU {100 * r['mfu_nominal']:.1f}%, peak "
        f"{r['peak_alloc_gib']:.2f} / {r['peak_reserved_gib']:.2f} GiB{kern}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(W.SHAPES), default="0.5b")
    ap.add_argument("--settings", nargs="+", default=["16384/1024"], help="micro-batch tokens/chunk rows")
    ap.add_argument("--variants", nargs="+", default=["base", "head+offsets"])
    ap.add_argument("--cells", nargs="*", default=[], help="more cells, each variant@tokens/chunk")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke run only")
    ap.add_argument("--trajectories", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="one more profiled update per cell")
    ap.add_argument("--root", type=Path, default=Path("/tmp/ascent_e2e"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--grad-ckpt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute each layer in backward (the e2e default); --no-grad-ckpt keeps the activations",
    )
    args = ap.parse_args(argv)

    from ascent.models.varlen import enable_for_training
    from ascent.trainer import OptimSettings, PolicyWorker

    res = W.report_header(args)
    path = W.make_checkpoint(args.root, args.shape, args.device)
    worker = PolicyWorker(
        path,
        device=args.device,
        dtype="bf16",
        gradient_checkpointing=args.grad_ckpt,
        compile="auto",
        optim=OptimSettings(lr=1e-6),
        seed=0,
    )
    res["facts"]["varlen"] = enable_for_training(worker.model, worker.device, worker.compute_dtype)
    samples = make_samples(args.trajectories, args.prompt_len, args.new_tokens, W.VOCAB)
    res["cells"] = []
    cells = [(v, s) for v in args.variants for s in args.settings] + [c.split("@") for c in args.cells]
    for name, setting in cells:
        res["cells"].append(run_cell(worker, samples, args, name, setting))
        print(line(res["cells"][-1]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
