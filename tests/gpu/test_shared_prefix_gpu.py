"""GPU checks of shared-prefix ("cascade") decode attention (triton_cascade.py; skipped without CUDA).

- kernels on the benchmark's shapes (256 rows = 32 prompts x 8 samples, 512-token prompts, contexts up to
  1024, Qwen2.5-0.5B's 14/2 heads of 64 and a 12/2 x 128 layout, bf16 and fp32): the cascade agrees with
  the plain kernel and the fp32 torch reference; rows in no group are the plain kernel's bit for bit; the
  cache writes and the in-kernel RoPE are the plain kernel's; the time of both is printed (run with -s).
- the engine (CUDA graphs, torch.compile) on a small saved model with 14/2 heads of 64, shared_prefix on
  and off, prompts x 8 samples, greedy and seeded sampling, also with fewer rows than samples (rows
  released and reused while others run): the first tokens' logprobs agree and almost all tokens match.
CPU counterparts: tests/unit/rollout_fast/test_fast_cascade_interpret.py (the kernels under the
interpreter, the engine on CPU) and test_prefix_groups.py. `bench/cascade_sweep.py` times the kernel settings.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cascade_sweep import workload  # noqa: E402  (bench/cascade_sweep.py: the benchmark's decode state)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _time_us(fn, reps=20) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("nh,kvh,d,ps", [(14, 2, 64, 64), (14, 2, 64, 16), (12, 2, 128, 64)])
def test_cascade_kernel_matches_plain_on_benchmark_shapes(dtype, nh, kvh, d, ps):
    from ascent.rollout.fast.attention import decode_attention_torch
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    q, kc, vc, bt, ctx, table, alone = workload(nh, kvh, d, ps, dtype)
    scale = d**-0.5
    got = cascade_decode_attention(q, kc, vc, bt, ctx, scale, table)
    plain = paged_decode_attention(q, kc, vc, bt, ctx, scale)
    want = decode_attention_torch(q.float(), kc.float(), vc.float(), bt, ctx, bt.shape[1] * ps, scale)
    live = ctx > 0
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert torch.allclose(got[live].float(), want[live], atol=tol, rtol=0)
    assert torch.allclose(got[live].float(), plain[live].float(), atol=tol, rtol=0)
    assert got[~live].abs().max() == 0
    t_plain = _time_us(lambda: paged_decode_attention(q, kc, vc, bt, ctx, scale))
    t_cascade = _time_us(lambda: cascade_decode_attention(q, kc, vc, bt, ctx, scale, table))
    shape = f"{dtype} nh={nh} kvh={kvh} d={d} ps={ps} b={len(q)}"
    print(f"\n{shape}: plain {t_plain:.1f} us, cascade {t_cascade:.1f} us")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("nh,d,pre_n,splits", [(12, 128, 128, 2), (12, 128, 128, 1), (14, 64, 128, 4)])
def test_prefix_blocks_spanning_pages_agree(dtype, nh, d, pre_n, splits):
    """The prefix kernel stepping over 2 pages of 64 at once (`prefix_block_n`, each token's page
    looked up) gives the one-page blocks' result to rounding. (256-token blocks of head dim 128 need more
    shared memory than a Hopper multiprocessor has: bench/cascade_sweep.py reports them.)"""
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention

    q, kc, vc, bt, ctx, table, _ = workload(nh, 2, d, 64, dtype)
    scale = d**-0.5
    one = cascade_decode_attention(q, kc, vc, bt, ctx, scale, table, prefix_splits=splits)
    got = cascade_decode_attention(
        q, kc, vc, bt, ctx, scale, table, prefix_splits=splits, prefix_block_n=pre_n
    )
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert torch.allclose(got.float(), one.float(), atol=tol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_in_no_group_are_bitwise_the_plain_kernel(dtype):
    """The compiled cascade variant of the split kernel gives rows in no group (and rows whose claim is
    refused) the plain kernel's bits: their arithmetic is the same code."""
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    q, kc, vc, bt, ctx, table, alone = workload(14, 2, 64, 64, dtype, prompts=8)
    got = cascade_decode_attention(q, kc, vc, bt, ctx, 0.125, table)
    plain = paged_decode_attention(q, kc, vc, bt, ctx, 0.125)
    assert torch.equal(got[alone], plain[alone])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cascade_writes_and_rotates_as_the_plain_kernel(dtype):
    """WRITE and ROPE on (q, k unrotated views of one fused q/k/v): the same cache bits, outputs close."""
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    nh, kvh, d = 14, 2, 64
    _, kc, vc, bt, ctx, table, _ = workload(nh, kvh, d, 64, dtype, prompts=16)
    b = len(ctx)
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(b, (nh + 2 * kvh) * d, generator=g).to("cuda", dtype)
    q, k, v = (t.view(b, -1, d) for t in qkv.split((nh * d, kvh * d, kvh * d), dim=-1))
    pos = (ctx - 1).clamp(min=0).float()
    angles = pos[:, None] * 1e4 ** -(torch.arange(0, d, 2, device="cuda") / d)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    got = cascade_decode_attention(q, kc1, vc1, bt, ctx, d**-0.5, table, (k, v), rope=(cos, sin))
    plain = paged_decode_attention(q, kc2, vc2, bt, ctx, d**-0.5, (k, v), rope=(cos, sin))
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert torch.allclose(got.float(), plain.float(), atol=tol, rtol=0)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("gpu_tiny_cascade"),
        hidden_size=896,
        num_layers=2,
        num_heads=14,
        num_kv_heads=2,
        tie_word_embeddings=False,
        seed=5,
    )


def _engine(ckpt, dtype, shared, **kw):
    kw.setdefault("kv_cache_tokens", 65536)
    engine = build_fast_engine(
        model_path=ckpt,
        dtype=dtype,
        device="cuda",
        max_model_len=512,
        attn_options={"shared_prefix": shared},
        **kw,
    )
    engine.update_weights([("lm_head.weight", engine.weights.lm_head.detach().float() * 10.0)])
    assert engine.runner.shared_prefix == shared
    return engine


def _requests(prompts=6, samples=8, temperature=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        GenerationRequest(
            torch.randint(4, 89, (150 + 37 * i,), generator=g).tolist(),
            SamplingParams(temperature=temperature, max_new_tokens=40 + 9 * i, n=samples, seed=100 + i),
            request_id=i,
        )
        for i in range(prompts)
    ]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("max_batch_size", [64, 20])
def test_engine_shared_prefix_on_and_off_agree(ckpt, dtype, temperature, max_batch_size):
    """The first generated token comes from the prefill (no cascade), the next from decode steps: over the
    first ten tokens, as far as both runs sampled the same ones, their logprobs agree; with fp32 the samples'
    common prefixes cover almost all tokens (a near-tie may flip a token, after which a sample goes its own
    way). bf16 only bounds the logprob gap: the two kernels sum the attention in another order, an ulp of
    bf16 that the head scaled x10 turns into up to 0.1 nat (an H200, 2026-11-28), and greedy decoding of
    this random model meets near-ties that send half the tokens their own way; fp32 is the strict check."""
    reqs = _requests(temperature=temperature)
    outs = [
        [g for r in _engine(ckpt, dtype, shared, max_batch_size=max_batch_size).generate(reqs) for g in r]
        for shared in (False, True)
    ]
    tol = 1e-4 if dtype == "fp32" else 0.3
    common = total = 0
    gaps = []
    for a, b in zip(*outs, strict=True):
        n = 0
        while n < min(len(a.token_ids), len(b.token_ids)) and a.token_ids[n] == b.token_ids[n]:
            n += 1
        k = min(n, 10)  # (past a differing token the logprobs are of other tokens)
        gaps += [abs(x - y) for x, y in zip(a.logprobs[:k], b.logprobs[:k], strict=True)]
        common += n
        total += max(len(a.token_ids), len(b.token_ids))
    print(f"{dtype} T={temperature} rows={max_batch_size}: logprob gap max {max(gaps):.4f} mean ", end="")
    print(f"{sum(gaps) / len(gaps):.5f} over {len(gaps)}; common-prefix share {common / total:.3f}")
    assert max(gaps) < tol
    assert dtype == "bf16" or common / total > 0.95, common / total
