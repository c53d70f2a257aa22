"""Two gloo processes, each updating on half a mini-batch with the global totals, match one process on all."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from trainer_helpers import make_samples, spawn_ranks

from ascent.trainer import LossSettings, OptimSettings, PolicyWorker, minibatch_totals


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_worker(path):
    loss = LossSettings(loss_aggregation="seq-mean-token-mean")
    return PolicyWorker(path, device="cpu", optim=OptimSettings(lr=1e-2, eps=1e-4), loss=loss, seed=0)


def _run_rank(rank, world, port, path, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        samples = make_samples(8, seed=9)
        tokens, seqs = minibatch_totals(samples)
        worker = _make_worker(path)
        metrics = worker.update(samples[rank::world], total_tokens=tokens, total_seqs=seqs)
        weights = {n: t.clone() for n, t in worker.named_weights()}
        torch.save({"metrics": metrics, "weights": weights}, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while another still works (it aborted the process)
    finally:
        dist.destroy_process_group()


def test_two_workers_match_one(tiny_path, tmp_path):
    spawn_ranks(_run_rank, (2, _free_port(), str(tiny_path), str(tmp_path)), 2)
    samples = make_samples(8, seed=9)
    tokens, seqs = minibatch_totals(samples)
    single = _make_worker(tiny_path)
    metrics = single.update(samples, total_tokens=tokens, total_seqs=seqs)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name, t in single.named_weights():
        for r in ranks:
            torch.testing.assert_close(r["weights"][name], t, atol=1e-6, rtol=0, msg=name)
    for key in ("loss/policy", "tokens", "response_tokens", "entropy", "grad_norm"):
        assert ranks[0]["metrics"][key] == pytest.approx(metrics[key], rel=1e-5), key
