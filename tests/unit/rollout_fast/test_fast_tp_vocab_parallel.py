"""The vocab-parallel LM head on CPU with gloo: two ranks, each with half the head (tied embeddings: a slice of
the embedding), sample what one process samples (same tokens, logprobs within 1e-5) on plain batches, seeded
sampled rows beside greedy ones, and all-greedy ones (where the split head runs: counted on the driver), and
on batches that need the whole distribution (top-p, repetition penalty, allowed tokens: the driver samples
from the full logits). The "symm" all-reduce falls back to NCCL/gloo on CPU with a warning."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine, tensor_parallel, tp_comm
from ascent.rollout.fast.tensor_parallel import ShardRunner, TPGroup
from ascent.rollout.fast.tp_comm import register_group


def _batches() -> list[list[GenerationRequest]]:
    def req(i: int, **params: Any) -> GenerationRequest:
        prompt = [4 + (5 * i + j) % 30 for j in range(4 + 3 * i)]
        return GenerationRequest(prompt, SamplingParams(max_new_tokens=12, **params))

    plain = [req(0, temperature=1.0, seed=5, n=2), req(1, temperature=0.0), req(2, temperature=0.7, seed=9)]
    greedy = [req(3, temperature=0.0, n=2), req(4, temperature=0.0)]
    full = [
        req(5, temperature=0.9, top_p=0.8, seed=1),
        req(6, temperature=1.0, repetition_penalty=1.3, seed=2),
        req(7, temperature=1.0, allowed_token_ids=tuple(range(10, 30)), seed=3),
    ]
    return [plain, greedy, full]


def _generate(engine) -> list:
    try:
        return [[(g.token_ids, g.logprobs) for gens in engine.generate(b) for g in gens] for b in _batches()]
    finally:
        if hasattr(engine, "shutdown"):
            engine.shutdown()


def test_two_ranks_with_split_head_sample_what_one_process_samples(tmp_path, monkeypatch):
    calls = []
    split = ShardRunner.vocab_parallel_sample
    monkeypatch.setattr(
        ShardRunner, "vocab_parallel_sample", lambda self, *a: calls.append(a[3]) or split(self, *a)
    )
    path = make_tiny_checkpoint(tmp_path, seed=6)  # tied embeddings: each rank's head is a slice of them
    kw: dict[str, Any] = {"model_path": path, "dtype": "fp32", "device": "cpu", "page_size": 8}
    kw |= {"max_model_len": 64, "max_batch_size": 4}
    with pytest.warns(UserWarning, match="tp_allreduce='symm': symmetric memory needs CUDA"):
        tp2 = _generate(build_fast_engine(**kw, tensor_parallel=2, tp_allreduce="symm", vocab_parallel=True))
    tp1 = _generate(build_fast_engine(**kw))
    for batch2, batch1 in zip(tp2, tp1, strict=True):
        assert [t for t, _ in batch2] == [t for t, _ in batch1]
        lp2 = torch.tensor([x for _, lps in batch2 for x in lps])
        lp1 = torch.tensor([x for _, lps in batch1 for x in lps])
        assert torch.allclose(lp2, lp1, atol=1e-5, rtol=0), (lp2 - lp1).abs().max()
    flags = {(f.all_greedy, f.top_k_top_p or f.penalty or f.restricted) for f in calls}
    assert flags == {(False, False), (True, False)}  # plain batches split, the others not
    assert len({tuple(t) for t, _ in tp1[0]}) == 4  # the seeded samples differ: noise decided them


def test_an_unknown_allreduce_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match=r"tp_allreduce='nvls': use one of \['nccl', 'nccl-dtype', 'symm'\]"):
        build_fast_engine(model_path="unused", tensor_parallel=2, tp_allreduce="nvls")


def test_a_group_registered_for_symmetric_memory_is_found_by_name():
    """(The "symm" mode's registration, here over gloo: the all-reduce itself needs CUDA, tests/gpu.)"""
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    pg = dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=30))
    kept = register_group("ascent-tp-test", 0, 1, dist.PrefixStore("symm", store), pg, torch.device("cpu"))
    group = c10d._resolve_process_group("ascent-tp-test")
    assert group is kept
    assert (group.rank(), group.size(), group.group_name) == (0, 1, "ascent-tp-test")
    t = torch.ones(3)
    group.allreduce(t).wait()
    assert t.tolist() == [1.0, 1.0, 1.0]


def test_a_process_that_already_set_up_symmetric_memory_is_blocked_from_a_second(monkeypatch):
    """torch counts symmetric memory's rendezvous per process: a second "symm" replica driven from one
    process would hang against fresh ranks, so that process votes it down (tp_comm.symmetric_blocker)."""
    monkeypatch.setattr(tp_comm, "symmetric_unavailable", lambda device: None)
    store = object()
    assert tp_comm.symmetric_blocker(torch.device("cuda", 0), store) is None
    assert "no store" in tp_comm.symmetric_blocker(torch.device("cuda", 0), None)
    monkeypatch.setattr(tp_comm, "_SETUPS", [1])
    assert "one 'symm' replica per process" in tp_comm.symmetric_blocker(torch.device("cuda", 0), store)


def test_one_ranks_reason_makes_every_rank_fall_back(monkeypatch):
    """The vote is a MIN over the ranks: a rank that can set up symmetric memory still takes NCCL when its
    peer cannot (here one process, group of one, whose single vote is 'cannot')."""
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    pg = dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=30))
    group = TPGroup(0, 1, pg, torch.device("cpu"), store, "ascent-tp-vote")
    monkeypatch.setattr(tensor_parallel, "symmetric_blocker", lambda device, store: "a peer said no")
    with pytest.warns(UserWarning, match="tp_allreduce='symm': a peer said no; using 'nccl'"):
        voted = group.with_allreduce("symm", 16)
    assert (voted.reduce, voted.symm) == ("nccl", None)
