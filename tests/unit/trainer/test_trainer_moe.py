"""Routing replay on a tiny Qwen3-MoE: the sampler/trainer logprob gap with and without replay.

The sampler is the reference engine, which records every token's experts; the trainer scores the same
responses with `compute_logprobs`, once replaying those experts and once routing itself. Routers are near
tied (`router_scale`) and the experts weigh a lot (`expert_scale`), so routing is sensitive.
- Same dtype (fp32 both sides): both sides route alike; the gap is rounding either way, within the dense
  fp32 bound of the fast-engine agreement test (1e-5). Replay changes nothing here, honestly.
- A bf16 sampler against the fp32 trainer (what half-precision rollout does): the trainer's own top-k
  differs from the sampler's on some tokens; without replay those tokens get logprobs of other experts and
  the gap grows several times; with replay it is back within what a dense model of the same size shows
  under the same bf16/fp32 mismatch (measured here on the tiny dense Qwen2), up to a factor for margin.
The same holds with the fast engine as the sampler (its own bf16 kernels, its recorded routes): replay
brings its gap back within its own dense bound.
Also: FSDP2 over two gloo ranks (expert weights sharded by expert) scores and updates with replay as one
process does.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ascent.messages import GenerationRequest, SamplingParams, TrainSample
from ascent.models.moe import RoutingRecorder
from ascent.models.tiny import make_tiny_moe_checkpoint
from ascent.rollout import build_engine
from ascent.trainer import PolicyWorker, minibatch_totals

FP32_BOUND = 1e-5  # tests/unit/rollout_fast/test_fast_logprobs_vs_trainer.py, dense fp32
DENSE_MARGIN = 3.0  # replay's bf16 gap may be this many times the dense model's


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe_replay")
    return make_tiny_moe_checkpoint(path, router_scale=0.02, expert_scale=3.0)


def _sampled(
    path, dtype: str, engine_name: str = "reference", lengths=(9, 30), new_tokens: int = 12
) -> list[tuple[TrainSample, list[float]]]:
    """(sample with the sampler's experts, sampler logprobs) for prompts of `lengths` x 3 samples."""
    fast_kw = {"page_size": 16, "max_model_len": 64} if engine_name == "fast" else {}
    engine = build_engine(engine_name, model_path=path, device="cpu", dtype=dtype, **fast_kw)
    g = torch.Generator().manual_seed(0)
    params = [SamplingParams(max_new_tokens=new_tokens, n=3, seed=n) for n in lengths]
    reqs = [
        GenerationRequest(torch.randint(4, 80, (n,), generator=g).tolist(), p)
        for n, p in zip(lengths, params, strict=True)
    ]
    out = []
    for req, gens in zip(reqs, engine.generate(reqs), strict=True):
        for gen in gens:
            n = len(gen.token_ids)
            sample = TrainSample(
                req.prompt_ids, gen.token_ids, [1] * n, [0.0] * n, routed_experts=gen.routed_experts
            )
            out.append((sample, gen.logprobs))
    return out


def _gap(worker, sampled, replay: bool) -> float:
    samples = [s if replay else replace(s, routed_experts=None) for s, _ in sampled]
    got = worker.compute_logprobs(samples)
    return max(
        abs(a - b) for lp, (_, want) in zip(got, sampled, strict=True) for a, b in zip(lp, want, strict=True)
    )


def _flipped_tokens(worker, sampled) -> int:
    """Tokens whose experts the trainer's own routing picks differently from the sampler's (any layer)."""
    flips = 0
    for s, _ in sampled:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad(), RoutingRecorder(worker.model) as rec:
            worker.model(input_ids=ids, use_cache=False)
            own = rec.take().sort(-1).values
        recorded = torch.as_tensor(s.routed_experts).sort(-1).values
        n = len(ids[0]) - 1  # the last token was never recorded
        flips += int((own[:n] != recorded[:n]).any(-1).any(-1).sum())
    return flips


def test_replay_keeps_the_gap_within_dense_bounds(moe_path, tiny_path):
    worker = PolicyWorker(moe_path, device="cpu")
    fp32 = _sampled(moe_path, "fp32")
    assert _gap(worker, fp32, replay=True) <= FP32_BOUND
    # same dtype: the same routes, replay or not, unless a near-tied router (this checkpoint's top-2 cut is
    # ~5 fp32 ulps wide at its narrowest) flips on another CPU's rounding; then replay alone is the bound
    if _flipped_tokens(worker, fp32) == 0:
        assert _gap(worker, fp32, replay=False) <= FP32_BOUND

    bf16 = _sampled(moe_path, "bf16")
    assert _flipped_tokens(worker, bf16) > 0  # the bf16 sampler routed some tokens elsewhere
    with_replay, without = _gap(worker, bf16, replay=True), _gap(worker, bf16, replay=False)
    dense = _gap(PolicyWorker(tiny_path, device="cpu"), _sampled(tiny_path, "bf16"), replay=False)
    assert with_replay <= DENSE_MARGIN * dense, (with_replay, dense)
    assert without >= 3 * with_replay, (without, with_replay)


@pytest.fixture
def one_thread():
    """Tiny tensors: one intra-op thread is faster than two on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_replay_of_the_fast_engines_routes(moe_path, tiny_path, one_thread):
    """The bf16 fast engine as the sampler, its dense bound measured on the same engine (its fp32 routes
    equal the reference engine's: tests/unit/rollout_fast/test_fast_moe.py). More tokens than above: its
    fp32 residual stream flips fewer routes."""
    worker = PolicyWorker(moe_path, device="cpu")
    shape = {"lengths": (9, 30, 17, 24), "new_tokens": 16}
    bf16 = _sampled(moe_path, "bf16", "fast", **shape)
    assert _flipped_tokens(worker, bf16) > 0
    with_replay, without = _gap(worker, bf16, replay=True), _gap(worker, bf16, replay=False)
    dense_sampled = _sampled(tiny_path, "bf16", "fast", **shape)
    dense = _gap(PolicyWorker(tiny_path, device="cpu"), dense_sampled, replay=False)
    assert with_replay <= DENSE_MARGIN * dense, (with_replay, dense)
    assert without >= 3 * with_replay, (without, with_replay)


# ------------------------------------------------------------------------------------------------ FSDP2
def _update(worker, samples):
    totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))
    return worker.update(samples, **totals)


def _run_rank(rank, port, path, samples, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        worker = PolicyWorker(path, device="cpu", sharding="fsdp", seed=0, max_tokens_per_micro_batch=64)
        gate_up = worker.model.model.layers[0].mlp.experts.gate_up_proj
        local = tuple(gate_up.to_local().shape)  # each rank holds half of the experts
        mine = samples[rank::2]
        lp = worker.compute_logprobs(mine)
        metrics = _update(worker, mine)
        after = worker.compute_logprobs(mine)
        torch.save(
            {"local": local, "lp": lp, "after": after, "loss": metrics["loss/policy"]}, f"{out_dir}/{rank}.pt"
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp_two_ranks_replay_as_one_process(moe_path, tmp_path):
    sampled = _sampled(moe_path, "bf16")
    samples = [
        replace(s, advantages=[1.0 if i % 2 else -1.0] * len(s.response_ids))
        for i, (s, _) in enumerate(sampled[:4])
    ]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_run_rank, args=(port, str(moe_path), samples, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in range(2)]
    assert [r["local"] for r in ranks] == [(4, 64, 64), (4, 64, 64)]  # 8 experts [E, 2I, H], 4 a rank
    single = PolicyWorker(moe_path, device="cpu", seed=0, max_tokens_per_micro_batch=64)
    want = single.compute_logprobs(samples)
    _update(single, samples)
    want_after = single.compute_logprobs(samples)
    for rank, r in enumerate(ranks):
        for got, exp in zip(r["lp"] + r["after"], want[rank::2] + want_after[rank::2], strict=True):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(exp), atol=2e-4, rtol=0)
