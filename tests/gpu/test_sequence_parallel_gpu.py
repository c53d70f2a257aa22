"""GPU check of sequence parallelism (skipped without 2 CUDA devices): two ranks over NCCL sharing every
packed row (`train.sequence_parallel=2`, FSDP2 over both) match one GPU on all the samples.

- fp32 (SDPA with a block-causal mask inside the Ulysses all-to-alls): logprobs, update metrics and weights
  after two optimizer steps equal one GPU's (GPU reduction order allows 1e-4);
- bf16 (the flash varlen kernel inside): logprobs and the first update's loss within bf16 rounding of one
  GPU's varlen run (FSDP2 gathers bf16 weights where one GPU autocasts fp32 ones: close, not equal).

Packed rows hold several sequences of a few hundred tokens; sequences cross the ranks' slice boundary.
"""

from __future__ import annotations

import os
import random
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ascent.messages import TrainSample
from ascent.models import varlen
from ascent.models.tiny import make_tiny_checkpoint
from ascent.trainer import LossSettings, OptimSettings, PolicyWorker, minibatch_totals

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (nvidia-h100-x2)"),
]
MAX_TOKENS = 2048
CUT = 5  # rank 0 is given the first 5 samples of every call, rank 1 the rest


def _samples() -> list[TrainSample]:
    rng = random.Random(3)
    out = []
    for _ in range(16):
        p, r = rng.randint(20, 300), rng.randint(50, 400)
        out.append(
            TrainSample(
                prompt_ids=[rng.randrange(4, 80) for _ in range(p)],
                response_ids=[rng.randrange(4, 80) for _ in range(r)],
                loss_mask=[1] * r,
                advantages=[rng.uniform(-1, 1)] * r,
                old_logprobs=[rng.uniform(-5, -3) for _ in range(r)],
            )
        )
    return out


def _policy(path, device, dtype, sharding="none", sp=1):
    loss = LossSettings(loss_aggregation="seq-mean-token-mean", entropy_coef=0.01)
    optim = OptimSettings(lr=1e-3, eps=1e-4)
    worker = PolicyWorker(
        path,
        device=device,
        dtype=dtype,
        optim=optim,
        loss=loss,
        max_tokens_per_micro_batch=MAX_TOKENS,
        sharding=sharding,
        sequence_parallel=sp,
        seed=0,
    )
    if sp == 1:
        varlen.enable_for_training(worker.model, worker.device, worker.compute_dtype)
    return worker


def _run(worker, share):
    samples = _samples()
    out = worker.compute_logprobs(share(samples))
    metrics = []
    for mb in (samples[:8], samples[8:]):
        tokens, seqs = minibatch_totals(mb)
        metrics.append(worker.update(share(mb), total_tokens=tokens, total_seqs=seqs))
    weights = {n: t.detach().float().cpu().clone() for n, t in worker.named_weights()}
    return {"out": out, "metrics": metrics, "weights": weights}


def _rank(rank, port, path, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    try:

        def share(samples):
            return samples[:CUT] if rank == 0 else samples[CUT:]

        device = f"cuda:{rank}"
        results = {
            dtype: _run(_policy(path, device, dtype, "fsdp", sp=2), share) for dtype in ("fp32", "bf16")
        }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gpus_sequence_parallel_match_one_gpu(tmp_path):
    path = make_tiny_checkpoint(
        tmp_path / "m", hidden_size=256, num_heads=8, num_kv_heads=2, max_position_embeddings=2048
    )
    mp.spawn(_rank, args=(_free_port(), str(path), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for dtype in ("fp32", "bf16"):
        single = _run(_policy(path, "cuda:0", dtype), lambda s: s)
        got_out = ranks[0][dtype]["out"] + ranks[1][dtype]["out"]
        flat_got = torch.tensor([x for seq in got_out for x in seq])
        flat_want = torch.tensor([x for seq in single["out"] for x in seq])
        if dtype == "fp32":
            torch.testing.assert_close(flat_got, flat_want, atol=1e-4, rtol=0)
            for m, w in zip(ranks[0][dtype]["metrics"], single["metrics"], strict=True):
                for key in ("loss/policy", "entropy", "grad_norm"):
                    assert m[key] == pytest.approx(w[key], rel=1e-3, abs=1e-5), key
            for name, t in single["weights"].items():
                for r in ranks:
                    torch.testing.assert_close(r[dtype]["weights"][name], t, atol=1e-4, rtol=0, msg=name)
        else:  # bf16 rounds differently on a different split of the work: close, not equal
            assert (flat_got - flat_want).abs().mean() < 2e-2
            first, want = ranks[0][dtype]["metrics"][0], single["metrics"][0]
            assert first["loss/policy"] == pytest.approx(want["loss/policy"], abs=2e-2)
            assert first["entropy"] == pytest.approx(want["entropy"], rel=1e-2)
