"""One optimizer step of a 7B Qwen2.5 shape on a 32k-token episode, with sequence parallelism over a node.

    python bench/long_context.py --workdir /tmp/lc [--tokens 32768] [--sp 0] [--gpus 0] [--shape 7b]
    python bench/long_context.py --device cpu --shape tiny --tokens 256 --gpus 2   # smoke run, gloo

Every GPU of the node (or --gpus) is a trainer rank (NCCL, `train.sharding=fsdp` over all of them); groups
of --sp ranks share each packed row (`train.sequence_parallel`; 0: the largest degree <= the GPU count that
splits the model's 28 attention heads / 4 KV heads, e.g. 4 on 8 GPUs, then 2 data-parallel groups). Each
sequence-parallel group trains on its own episode of --tokens tokens (a prompt of a quarter of them, the
rest response, random ids), so the step holds groups x episodes. The checkpoint has random weights
(bench/e2e_workload.py, bf16 on disk, written once into --workdir), the trainer computes in bf16 with fp32
masters, gradient checkpointing on, varlen flash attention inside the Ulysses all-to-alls.

Prints, per rank: the time of a warm-up step and of the measured step, and the peak allocated / reserved
GPU memory (torch.cuda.max_memory_allocated / reserved over the measured step), as one JSON line per rank;
`--out` also writes them as a JSON list. `ascent doctor`'s estimate for the same plan is printed beside
(`ascent.doctor.memory`), so the two can be compared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench/ modules, and ascent from this checkout

from e2e_workload import VOCAB, make_checkpoint, qwen_config  # noqa: E402

from ascent.doctor import memory as M  # noqa: E402
from ascent.messages import TrainSample  # noqa: E402
from ascent.models.ulysses import largest_degree  # noqa: E402
from ascent.trainer import LossSettings, OptimSettings, PolicyWorker, minibatch_totals  # noqa: E402


def episode(tokens: int, seed: int) -> TrainSample:
    """One long episode: a quarter prompt, the rest response (all sampled), random token ids."""
    rng = random.Random(seed)
    prompt = tokens // 4
    resp = tokens - prompt
    return TrainSample(
        prompt_ids=[rng.randrange(2, VOCAB) for _ in range(prompt)],
        response_ids=[rng.randrange(2, VOCAB) for _ in range(resp)],
        loss_mask=[1] * resp,
        advantages=[1.0] * resp,
        old_logprobs=[-11.0] * resp,
    )


def rank_main(rank: int, world: int, port: int, path: str, args: Any, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        worker = PolicyWorker(
            path,
            device=f"cuda:{rank}" if cuda else "cpu",
            dtype="bf16",
            gradient_checkpointing=True,
            optim=OptimSettings(lr=1e-6),
            loss=LossSettings(),
            max_tokens_per_micro_batch=args.tokens,
            logprob_chunk_tokens=args.chunk,
            sharding="fsdp" if world > 1 else "none",
            sequence_parallel=args.sp,
            attention="auto",
            seed=0,
        )
        groups = world // args.sp
        batch = [episode(args.tokens, seed=g) for g in range(groups)]
        totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(batch), strict=True))
        mine = [batch[rank // args.sp]] if rank % args.sp == 0 else []  # one rank of a group hands it in
        times = []
        for _ in range(2):  # a warm-up step (allocator, kernels), then the measured one
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            dist.barrier()
            start = time.perf_counter()
            metrics = worker.update(mine, **totals)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        row = {
            "rank": rank,
            "world": world,
            "sequence_parallel": args.sp,
            "tokens_per_episode": args.tokens,
            "warmup_s": round(times[0], 3),
            "step_s": round(times[1], 3),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None,
            "loss": metrics["loss/total"],
            "grad_norm": metrics["grad_norm"],
            "device": torch.cuda.get_device_name(rank) if cuda else "cpu",
        }
        print(json.dumps(row), flush=True)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(row))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def doctor_estimate(args: Any, world: int) -> float:
    """`ascent doctor`'s peak for this plan (GiB): FSDP over `world`, one episode per group."""
    c = qwen_config(args.shape)
    hd = c.hidden_size // c.num_attention_heads
    shape = M.ModelShape(
        params=_params(c),
        vocab=VOCAB,
        hidden=c.hidden_size,
        intermediate=c.intermediate_size,
        layers=c.num_hidden_layers,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=hd,
        tied=c.tie_word_embeddings,
    )
    m = M.MemoryInputs(
        shape=shape,
        gradient_checkpointing=True,
        micro_batch_tokens=args.tokens,
        response_tokens=args.tokens - args.tokens // 4,
        logprob_chunk=args.chunk,
        fsdp_ranks=world,
        sequence_parallel=args.sp,
        colocated=False,
    )
    est = M.estimate(m)
    return round(est.total("update") / 2**30, 2)


def _params(c: Any) -> int:
    h, i, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    kv = c.num_key_value_heads * (h // c.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + (h + 2 * kv) + 3 * h * i + 2 * h
    return VOCAB * h * (1 if c.tie_word_embeddings else 2) + n * per_layer + h


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/ascent_long_context")
    ap.add_argument("--shape", default="7b")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--gpus", type=int, default=0, help="trainer ranks (0: every visible GPU)")
    ap.add_argument("--sp", type=int, default=0, help="sequence-parallel degree (0: the largest that fits)")
    ap.add_argument("--chunk", type=int, default=1024, help="train.logprob_chunk_tokens")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a gloo smoke run")
    args = ap.parse_args(argv)
    world = args.gpus or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if world < 1:
        raise SystemExit("bench/long_context.py needs CUDA GPUs (or --device cpu for a smoke run).")
    c = qwen_config(args.shape)
    if not args.sp:
        args.sp = largest_degree(c.num_attention_heads, c.num_key_value_heads, world)
        while world % args.sp:
            args.sp -= 1
    path = make_checkpoint(args.workdir, args.shape, device=args.device)
    print(
        f"{world} rank(s), sequence_parallel={args.sp}, {world // args.sp} episode(s) of {args.tokens} "
        f"tokens; doctor's update estimate {doctor_estimate(args, world)} GiB per rank",
        flush=True,
    )
    out_dir = Path(args.workdir, "ranks")
    out_dir.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(world, port, str(path), args, str(out_dir)), nprocs=world, join=True)
    rows = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
