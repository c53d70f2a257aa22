"""Sequence parallelism (Ulysses) on CPU with gloo: two ranks sharing every packed row (each given part of
the samples) match one process on all of them: logprobs, update metrics and weights, with FSDP2 over both
ranks and with replicated weights; packed rows hold several sequences and one crosses the ranks' slice
boundary. Also: KV heads fewer than ranks (replicated), the slicing of a row, the checks and their errors."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from trainer_helpers import make_samples, spawn_ranks

from ascent.config.schema import RunConfig
from ascent.models import ulysses
from ascent.trainer import LossSettings, OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer import sequence_parallel as sp_lib
from ascent.trainer.packing import pack, plan_micro_batches

MAX_TOKENS = 40
CUT = 3  # rank 0 is given samples [:3] of each mini-batch, rank 1 the rest


def _samples():
    return make_samples(16, seed=11)


def _mini_batches():
    s = _samples()
    return [s[:8], s[8:]]


def _policy(path, sharding="none", sp=1):
    loss = LossSettings(loss_aggregation="seq-mean-token-mean", entropy_coef=0.01)
    optim = OptimSettings(lr=1e-2, eps=1e-4)
    kw = {"max_tokens_per_micro_batch": MAX_TOKENS, "sharding": sharding, "seed": 0}
    return PolicyWorker(path, device="cpu", optim=optim, loss=loss, sequence_parallel=sp, **kw)


def _run(worker, share):
    out = worker.compute_logprobs(share(_samples()))
    metrics = []
    for mb in _mini_batches():
        tokens, seqs = minibatch_totals(mb)
        metrics.append(worker.update(share(mb), total_tokens=tokens, total_seqs=seqs))
    weights = {n: t.detach().clone() for n, t in worker.named_weights()}
    return {"out": out, "metrics": metrics, "weights": weights}


def _attention_with_one_kv_head(rank):
    """q [16, 4 heads], k/v [16, 1 KV head] over 2 ranks (the KV head replicated) == the whole row."""
    torch.manual_seed(0)
    q, k, v = torch.randn(16, 4, 8), torch.randn(16, 1, 8), torch.randn(16, 1, 8)
    cu = torch.tensor([0, 5, 11, 16], dtype=torch.int32)
    want = ulysses.block_causal_attention(q, k, v, cu, 0.3)
    mine = [t[rank * 8 : (rank + 1) * 8].transpose(0, 1)[None] for t in (q, k, v)]
    got, _ = ulysses.ulysses_attention(None, *mine, None, scaling=0.3, cu_seq_lens_q=cu, max_length_q=6)
    torch.testing.assert_close(got[0], want[rank * 8 : (rank + 1) * 8], atol=1e-6, rtol=0)


def _run_rank(rank, world, port, path, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:

        def share(samples):
            return samples[:CUT] if rank == 0 else samples[CUT:]

        fsdp, replicated = _policy(path, "fsdp", sp=2), _policy(path, "none", sp=2)
        for worker in (fsdp, replicated):  # the row is split and attention runs across the ranks
            assert worker.sp is not None and worker.sp.size == 2
            assert worker.model.config._attn_implementation == ulysses.NAME
        results = {"fsdp": _run(fsdp, share), "replicated": _run(replicated, share)}
        _attention_with_one_kv_head(rank)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while another still works
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_sequence_parallel_ranks_match_one_process(tiny_path, tmp_path):
    crossing = 0
    for mb in _mini_batches():
        for idx in plan_micro_batches([s.num_tokens for s in mb], MAX_TOKENS):
            packed = pack([mb[i] for i in idx])
            half = -(-packed.num_tokens // 2)
            cu = packed.cu_seqlens.tolist()
            crossing += any(a < half < b for a, b in zip(cu, cu[1:], strict=False)) and len(idx) > 1
    assert crossing >= 2  # packed multi-sequence rows with a sequence across the slice boundary
    spawn_ranks(_run_rank, (2, _free_port(), str(tiny_path), str(tmp_path)), 2)
    single = _run(_policy(tiny_path), lambda s: s)
    for r in range(2):
        ranks = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        for name, got in ranks.items():
            want_out = single["out"][:CUT] if r == 0 else single["out"][CUT:]
            for a, b in zip(got["out"], want_out, strict=True):
                torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
            for m, w in zip(got["metrics"], single["metrics"], strict=True):
                for key in ("loss/policy", "loss/total", "entropy", "grad_norm", "tokens", "micro_batches"):
                    assert m[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), (name, key)
            for pname, t in single["weights"].items():
                torch.testing.assert_close(got["weights"][pname], t, atol=1e-5, rtol=0, msg=(name, pname))


def test_slice_row_keeps_global_offsets_and_splits_the_response_rows():
    samples = make_samples(3, seed=2)
    packed = pack(samples)
    slices = [sp_lib.slice_row(packed, 2, r) for r in range(2)]
    n = slices[0].input_ids.shape[1]
    assert 2 * n >= packed.num_tokens > 2 * n - 2
    ids = torch.cat([s.input_ids for s in slices], dim=1)[:, : packed.num_tokens]
    assert torch.equal(ids, packed.input_ids)
    assert int(slices[0].cu[-1]) == 2 * n  # the padding is a sequence of its own
    assert slices[0].counts == slices[1].counts and sum(slices[0].counts) == len(packed.targets)
    rows = torch.cat([s.logit_index + r * n for r, s in enumerate(slices)])
    assert torch.equal(rows, packed.logit_index)


def test_checks_name_the_field_and_the_fix():
    assert ulysses.check_heads(28, 4, 4) is None and ulysses.check_heads(4, 2, 4) is None  # KV replicated
    assert "28 attention heads" in ulysses.check_heads(28, 4, 8)
    assert "KV heads" in ulysses.check_heads(12, 3, 2)
    assert ulysses.largest_degree(28, 4, 8) == 4
    config = type("C", (), {"num_attention_heads": 28, "num_key_value_heads": 4})()
    with pytest.raises(sp_lib.SequenceParallelError, match=r"train.sequence_parallel=8: .*e\.g\. 4") as err:
        sp_lib.check_model(8, config)
    assert err.value.exit_code == 2
    with pytest.raises(ValueError, match="cluster.num_trainer_workers=3 does not split"):
        RunConfig.model_validate(
            {
                "train": {"sequence_parallel": 2, "trajectories_per_update": 3},
                "rollout": {"prompts_per_step": 3, "samples_per_prompt": 2},
                "cluster": {"backend": "ray", "num_trainer_workers": 3, "num_rollout_workers": 3},
            }
        )
