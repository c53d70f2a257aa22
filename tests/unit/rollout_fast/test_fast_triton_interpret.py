"""The Triton kernels under the CPU interpreter (TRITON_INTERPRET=1), against their torch references.

The interpreter must be switched on before anything imports triton: triton's own `tl.max`/`tl.sum` are
@jit functions, built compiled or interpreted once, at that import, and in a whole-suite run torch's
inductor imports triton long before this module. So in the suite these tests run in a child Python started
with TRITON_INTERPRET=1 (`test_kernels_under_the_interpreter`, which fails if any of them fails there), and
the parent reports them as skipped; `TRITON_INTERPRET=1 pytest <this file>` runs them directly.
Skipped where triton is not installed, on CUDA machines (tests/gpu runs the compiled kernels), and on numpy
>= 2.4, whose scalar conversion rules the triton 3.6 interpreter trips over (the dev extra keeps numpy below
2.4, so the README's test command runs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("tests/gpu covers the compiled kernels", allow_module_level=True)
# interpreted in this process only where the switch was on before triton's first import
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1" and "triton" not in sys.modules
pytest.importorskip("triton")
CHILD = "ASCENT_INTERPRET_CHILD"  # set in the child: it never starts another
pytestmark = pytest.mark.skipif(
    np.lib.NumpyVersion(np.__version__) >= "2.4.0", reason="the triton 3.6 interpreter needs numpy < 2.4"
)


@pytest.fixture(autouse=True)
def _in_the_child(request):
    if not INTERPRETING and request.node.originalname != "test_kernels_under_the_interpreter":
        pytest.skip("runs in the child Python of test_kernels_under_the_interpreter (module doc)")


# the modules whose tests the one child Python interprets (it pays torch's and triton's import once), and
# how many of their tests pass there at least: this module's 17, the shared-prefix kernels' 11
CHILD_MODULES = ("test_fast_triton_interpret.py", "test_fast_cascade_interpret.py")
CHILD_PASSES = 17 + 11


def test_kernels_under_the_interpreter():
    """Every other test of this module and of test_fast_cascade_interpret.py, in one child Python with
    TRITON_INTERPRET=1 set from its start."""
    if os.environ.get(CHILD) or INTERPRETING:
        pytest.skip("this process interprets the kernels itself")
    root = Path(__file__).resolve().parents[3]
    modules = [str(Path(__file__).with_name(m)) for m in CHILD_MODULES]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore", *modules]
    env = dict(os.environ, TRITON_INTERPRET="1", **{CHILD: "1"})
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=2400)
    tail = r.stdout[-8000:] + r.stderr[-2000:]
    assert r.returncode == 0, tail
    summary = r.stdout.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary)[1])
    assert re.search(r"\b1 skipped", summary) and passed >= CHILD_PASSES, tail


@pytest.mark.parametrize(
    "ps,splits,block_n,write", [(16, 1, 16, False), (32, 3, 16, True), (64, 2, 64, True)]
)
def test_paged_decode_attention_matches_torch(ps, splits, block_n, write):
    from ascent.rollout.fast.attention import decode_attention_torch
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    g = torch.Generator().manual_seed(0)
    b, nh, kvh, d, width, pages = 4, 14, 2, 64, 6, 30
    kc, vc = torch.randn(2, pages, kvh, ps, d, generator=g)
    bt = torch.stack([torch.randperm(pages - 1, generator=g)[:width] + 1 for _ in range(b)]).int()
    ctx = torch.tensor([width * ps, 1, 37, 0], dtype=torch.int32)
    q, kn, vn = (
        torch.randn(b, nh, d, generator=g),
        torch.randn(b, kvh, d, generator=g),
        torch.randn(b, kvh, d, generator=g),
    )
    kc2, vc2 = kc.clone(), vc.clone()
    out = paged_decode_attention(q, kc2, vc2, bt, ctx, d**-0.5, (kn, vn) if write else None, splits, block_n)
    if write:
        for i in range(3):
            pos = int(ctx[i]) - 1
            kc[bt[i, pos // ps], :, pos % ps], vc[bt[i, pos // ps], :, pos % ps] = kn[i], vn[i]
        assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    want = decode_attention_torch(q, kc, vc, bt, ctx, width * ps, d**-0.5)
    assert torch.allclose(out[:3], want[:3], atol=1e-5) and out[3].abs().max() == 0


@pytest.mark.parametrize("config", [(1024, 256, 4), (1024, 1024, 4), (2048, 512, 8), (8192, 512, 2)])
def test_triton_sampler_matches_sampling_py(config):
    from ascent.messages import SamplingParams
    from ascent.rollout.fast.triton_sample import triton_sample
    from ascent.rollout.sampling import SamplingTensors, sample

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3000, generator=g) * 3
    logits[1, 17] = logits[1, 2900] = 50.0  # a greedy tie: the first index wins
    params = [SamplingParams(temperature=t) for t in (1.0, 0.0, 0.7, 1.3, 0.0, 1.0)]
    st = SamplingTensors.from_params(params, [3, 2**62 + 5, 7, 2**40 + 1, 5, 0])
    steps = torch.tensor([0, 5, 17, 3, 9, 2**33 + 4])
    want_t, want_lp = sample(logits, st, steps)
    got_t, got_lp = triton_sample(logits, st.temperature, st.seeds, steps, False, config)
    assert got_t.tolist() == want_t.tolist() and torch.allclose(got_lp, want_lp, atol=1e-5)


def test_triton_sampler_bound_keeps_tokens_on_peaked_logits():
    """Peaked logits (a trained model's shape) let the kernel skip most blocks' noise; the tokens and
    logprobs stay those of sampling.py at every step and temperature, ties of the top logit included."""
    from ascent.messages import SamplingParams
    from ascent.rollout.fast.triton_sample import triton_sample
    from ascent.rollout.sampling import SamplingTensors, sample

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 4096, generator=g) * 2
    for r in range(8):  # a few strong candidates a row, spread over the blocks
        logits[r, torch.randint(0, 4096, (4,), generator=g)] += torch.tensor([14.0, 12.0, 11.5, 9.0])
    logits[3, 100] = logits[3, 3000] = 40.0  # two equal top logits
    params = [SamplingParams(temperature=t) for t in (1.0, 0.5, 1.0, 1.0, 2.0, 0.0, 0.8, 1.0)]
    st = SamplingTensors.from_params(params, [11 * i + 1 for i in range(8)])
    for step in (0, 1, 2, 97):
        steps = torch.full((8,), step)
        want_t, want_lp = sample(logits, st, steps)
        got_t, got_lp = triton_sample(logits, st.temperature, st.seeds, steps, False, (2048, 256, 4))
        assert got_t.tolist() == want_t.tolist(), step
        assert torch.allclose(got_lp, want_lp, atol=1e-5)


@pytest.mark.parametrize("ps,block_m,block_n", [(16, 16, 16), (32, 16, 32), (64, 32, 16)])
def test_paged_prefill_attention_matches_torch(ps, block_m, block_n):
    """Rows continuing cached prefixes of different lengths (0, a page boundary, mid-page) with padded
    suffixes: the kernel equals the masked torch path on every real query token."""
    from ascent.rollout.fast.attention import prefill_attention
    from ascent.rollout.fast.triton_prefill import paged_prefill_attention

    g = torch.Generator().manual_seed(1)
    nh, kvh, d, width, pages = 6, 2, 32, 6, 40
    starts = torch.tensor([0, ps, 37, 5], dtype=torch.int32)
    lens = torch.tensor([40, 3, 50, 1], dtype=torch.int32)
    b, lq = len(starts), int(lens.max())
    kc, vc = torch.randn(2, pages, kvh, ps, d, generator=g)
    bt = torch.stack([torch.randperm(pages - 1, generator=g)[:width] + 1 for _ in range(b)]).int()
    q = torch.randn(b, lq, nh, d, generator=g)
    k, v = torch.randn(2, b, lq, kvh, d, generator=g)
    lk = int((starts + lens).max())
    out = paged_prefill_attention(q, kc, vc, bt, starts, lens, d**-0.5, block_m=block_m, block_n=block_n)
    want = prefill_attention(q, k, v, d**-0.5, (kc, vc, bt, starts.long(), lk))
    for i in range(b):
        n = int(lens[i])
        assert torch.allclose(out[i, :n], want[i, :n], atol=1e-5), i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_attention_rotating_q_and_k_equals_apply_rope_then_the_kernel(dtype, splits, rtne_bf16):
    """Unrotated q/k (views of one fused q/k/v output, as attn_in makes them) plus the rows' cos/sin: the
    kernel's rotation gives bit for bit apply_rope's q and k (zero rows included: the sign of a zero too),
    so the cache and the output are those of apply_rope followed by the kernel. (In bf16 the interpreter's
    `tl.dot` multiplies the raw 16-bit patterns, so the output is no attention, but it is a function of
    q's and the cache's bits, which is what the comparison needs.)"""
    from ascent.rollout.fast.layers import apply_rope
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    g = torch.Generator().manual_seed(2)
    b, nh, kvh, d, ps, width, pages = 4, 6, 2, 32, 16, 4, 20
    kc, vc = torch.randn(2, pages, kvh, ps, d, generator=g).to(dtype)
    bt = torch.stack([torch.randperm(pages - 1, generator=g)[:width] + 1 for _ in range(b)]).int()
    ctx = torch.tensor([width * ps, 1, 37, 0], dtype=torch.int32)
    qkv = (torch.randn(b, (nh + 2 * kvh) * d, generator=g) * 3).to(dtype)
    qkv[1] = 0.0  # a zero token (a padding embedding, no bias): rotated zeros keep torch's signs
    q, k, v = (t.view(b, -1, d) for t in qkv.split((nh * d, kvh * d, kvh * d), dim=-1))
    pos = (ctx - 1).clamp(min=0).float()
    angles = pos[:, None] * 1e4 ** -(torch.arange(0, d, 2) / d)
    cos, sin = torch.cat((angles, angles), dim=-1).cos(), torch.cat((angles, angles), dim=-1).sin()
    kc2, vc2 = kc.clone(), vc.clone()
    got = paged_decode_attention(q, kc2, vc2, bt, ctx, d**-0.5, (k, v), splits, 16, rope=(cos, sin))
    qr, kr = apply_rope(q, cos, sin, dtype), apply_rope(k, cos, sin, dtype)
    want = paged_decode_attention(qr, kc, vc, bt, ctx, d**-0.5, (kr, v), splits, 16)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(kc2.view(bits), kc.view(bits)) and torch.equal(vc2, vc)
    assert torch.equal(got.view(bits), want.view(bits))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_engine_rotating_in_the_decode_kernel_samples_the_same_tokens_and_logprobs(
    fast_tiny_path, dtype, rtne_bf16
):
    """The engine on the Triton decode kernel, RoPE in attn_in or in the kernel (`fused_rope`): greedy and
    sampled tokens and their logprobs are equal. (bf16 attention is no attention under the interpreter, see
    above, but still a function of q's and k's bits. Compiled, eager as here: also equal, checked by hand;
    the first compile under the interpreter takes about a minute.)"""
    from ascent.messages import GenerationRequest, SamplingParams
    from ascent.rollout.fast import build_fast_engine

    g = torch.Generator().manual_seed(3)
    reqs = [
        GenerationRequest(
            torch.randint(4, 60, (n,), generator=g).tolist(),
            SamplingParams(max_new_tokens=6, n=k, seed=5 + i, temperature=t),
            request_id=i,
        )
        for i, (n, k, t) in enumerate([(5, 1, 0.0), (19, 2, 1.0), (3, 2, 0.0)])
    ]

    def run(fused: bool) -> list:
        engine = build_fast_engine(
            model_path=fast_tiny_path,
            dtype=dtype,
            device="cpu",
            page_size=16,
            max_model_len=64,
            attention="triton",
            sampler="torch",
            # the per-row kernel alone (test_fast_cascade_interpret.py rotates in the shared-prefix kernels)
            attn_options={"fused_rope": fused, "splits": 2, "shared_prefix": False},
        )
        assert engine.runner.rotates_in_kernel() == (fused and dtype == "bf16")  # fp32: attn_in rotates
        return [[(s.token_ids, s.logprobs) for s in out] for out in engine.generate(reqs)]

    assert run(True) == run(False)
