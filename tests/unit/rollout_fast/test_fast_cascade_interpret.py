"""Shared-prefix decode attention (triton_cascade.py + triton_decode.py) under the Triton CPU interpreter.

The kernels against the plain decode kernel and the torch reference: groups of 1 to 8 rows over shared
pages (G = 7 and G = 6 query heads per KV head), members with different suffix lengths, a prefix that is
no multiple of the prefix split, rows in no group and idle rows (which must equal the plain kernel bit for
bit), the new-token write and the in-kernel RoPE, and group claims that must be refused (a stale group).
Then the engine with `shared_prefix` on and off.

As test_fast_triton_interpret.py (see its module doc): in a suite run these tests run in the child Python
that `test_fast_triton_interpret.py::test_kernels_under_the_interpreter` starts with TRITON_INTERPRET=1
(one child for both modules), and the parent reports them skipped.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("tests/gpu/test_shared_prefix_gpu.py covers the compiled kernels", allow_module_level=True)
# interpreted where the switch was on before triton's first import: in the child Python (which set it at its
# start, before test_fast_triton_interpret.py imported triton) or in a run of this module alone
CHILD = "ASCENT_INTERPRET_CHILD"
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1" and (
    "triton" not in sys.modules or os.environ.get(CHILD) == "1"
)
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    np.lib.NumpyVersion(np.__version__) >= "2.4.0", reason="the triton 3.6 interpreter needs numpy < 2.4"
)
MEMBERS = 8


@pytest.fixture(autouse=True)
def _in_the_child(request):
    if not INTERPRETING:
        pytest.skip(
            "runs in the child Python of test_fast_triton_interpret.py::test_kernels_under_the_interpreter"
        )


def scene(groups, loners, nh, kvh, d, ps, dtype=torch.float32, seed=0):
    """groups: [(n shared pages, [suffix length of each member])], loners: [context] (0: idle) -> q [B, nh,
    d], caches [pages, kvh, ps, d], block tables [B, P], contexts [B], the group table [B, 2 + MEMBERS]
    (prefix_groups.py's layout; a group of one row or n = 0 allowed here) and the grouped rows. Rows are
    shuffled so that members do not sit side by side; every row's pages are distinct except the shared."""
    g = torch.Generator().manual_seed(seed)
    specs = [(i, n, suf) for i, (n, sufs) in enumerate(groups) for suf in sufs] + [(-1, 0, c) for c in loners]
    order = torch.randperm(len(specs), generator=g).tolist()
    specs = [specs[i] for i in order]
    width = max(-(-(n * ps + suf) // ps) for _, n, suf in specs)
    own = sum(-(-suf // ps) for _, _, suf in specs)
    pool = (torch.randperm(own + len(groups) * width + 4, generator=g) + 1).tolist()
    shared = [[pool.pop() for _ in range(n)] for n, _ in groups]
    b = len(specs)
    bt = torch.zeros(b, width, dtype=torch.int32)
    ctx = torch.zeros(b, dtype=torch.int32)
    table = torch.full((b, 2 + MEMBERS), -1, dtype=torch.int32)
    table[:, 1] = 0
    members: list[list[int]] = [[] for _ in groups]
    for r, (i, n, suf) in enumerate(specs):
        if i < 0 and suf == 0:
            continue  # idle: context 0, every entry the trash page
        pages = (shared[i] if i >= 0 else []) + [pool.pop() for _ in range(-(-suf // ps))]
        bt[r, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        ctx[r] = n * ps + suf
        if i >= 0:
            members[i].append(r)
    for slot, (rows, (n, _)) in enumerate(zip(members, groups, strict=True)):
        table[slot, 1], table[slot, 2 : 2 + len(rows)] = n, torch.tensor(rows, dtype=torch.int32)
        table[rows, 0] = slot
    pages = int(bt.max()) + 1
    kc, vc = torch.randn(2, pages, kvh, ps, d, generator=g).to(dtype)
    q = torch.randn(b, nh, d, generator=g).to(dtype)
    return q, kc, vc, bt, ctx, table, sorted(r for rows in members for r in rows)


def rope_tables(ctx, d):
    pos = (ctx - 1).clamp(min=0).float()
    angles = pos[:, None] * 1e4 ** -(torch.arange(0, d, 2) / d)
    return torch.cat((angles, angles), dim=-1).cos(), torch.cat((angles, angles), dim=-1).sin()


GROUPS = [(3, [5, 20, 1, 33]), (2, [16, 7]), (5, [9, 2, 40, 17, 1, 3, 11, 25]), (4, [8])]


# each head shape meets two of the four kernel settings (the full cross took 40 s of CI under the interpreter);
# pre_n: the prefix kernel's block, None (the split kernel's) or spanning 2 pages (the shared page counts
# 3 and 5 leave a block half past the prefix, masked)
@pytest.mark.parametrize(
    "nh,kvh,d,ps,block_n,splits,prefix_splits,write,pre_n",
    [
        (14, 2, 64, 16, 16, 1, 1, False, None),
        (12, 2, 128, 16, 16, 3, 2, True, 32),
        (14, 2, 64, 32, 16, 2, 3, True, 64),
        (12, 2, 128, 16, 16, 2, 7, False, None),
    ],
)
def test_cascade_matches_the_plain_kernel_and_torch(
    nh, kvh, d, ps, block_n, splits, prefix_splits, write, pre_n
):
    """fp32: grouped rows agree with the plain kernel and the torch reference to rounding; rows in no group
    and idle rows are the plain kernel's bit for bit; the cache writes are the same."""
    from ascent.rollout.fast.attention import decode_attention_torch
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    q, kc, vc, bt, ctx, table, grouped = scene(GROUPS, [0, 37, 1, 0], nh, kvh, d, ps)
    b = len(q)
    g = torch.Generator().manual_seed(1)
    new = (torch.randn(b, kvh, d, generator=g), torch.randn(b, kvh, d, generator=g)) if write else None
    kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    got = cascade_decode_attention(
        q,
        kc1,
        vc1,
        bt,
        ctx,
        d**-0.5,
        table,
        new,
        splits,
        block_n,
        prefix_splits=prefix_splits,
        prefix_block_n=pre_n,
    )
    plain = paged_decode_attention(q, kc2, vc2, bt, ctx, d**-0.5, new, splits, block_n)
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    want = decode_attention_torch(q, kc2, vc2, bt, ctx, bt.shape[1] * ps, d**-0.5)
    live = ctx > 0
    assert torch.allclose(got[live], plain[live], atol=1e-5, rtol=0)
    assert torch.allclose(got[live], want[live], atol=1e-5, rtol=0)
    alone = [r for r in range(b) if r not in grouped]
    assert torch.equal(got[alone], plain[alone]) and got[~live].abs().max() == 0


def test_group_with_no_shared_pages_is_the_plain_kernel():
    """n = 0 in a group's slot: its members attend as rows in no group, bit for bit."""
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    q, kc, vc, bt, ctx, table, _ = scene([(0, [20, 35, 3])], [12], 14, 2, 64, 16)
    got = cascade_decode_attention(q, kc, vc, bt, ctx, 0.125, table, None, 2, 16, prefix_splits=2)
    assert torch.equal(got, paged_decode_attention(q, kc, vc, bt, ctx, 0.125, None, 2, 16))


def test_stale_claims_are_refused():
    """A row whose group entry no longer fits it attends alone, bit for bit: its pages are another
    prompt's (the row was reused), its newest position lies inside the shared pages, or its group no longer
    lists it (a member slot now names a row past the batch, which is never read or written)."""
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    q, kc, vc, bt, ctx, table, _ = scene([(3, [5, 9, 14]), (2, [4, 6, 8])], [30], 12, 2, 128, 16)
    a, reused, early = (int(r) for r in table[0, 2:5])
    d, unlisted, e = (int(r) for r in table[1, 2:5])
    bt[reused, 1] = bt[a, 3]  # one of the shared pages replaced (by a page of a's own)
    ctx[early] = 3 * 16  # newest position inside the third shared page
    table[1, 3] = len(q) + 5
    got = cascade_decode_attention(q, kc, vc, bt, ctx, 0.125, table, None, 2, 16, prefix_splits=2)
    plain = paged_decode_attention(q, kc, vc, bt, ctx, 0.125, None, 2, 16)
    for r in (reused, early, unlisted):
        assert torch.equal(got[r], plain[r]), r
    assert torch.allclose(got[[a, d, e]], plain[[a, d, e]], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "dtype,nh,d,prefix_splits", [(torch.float32, 14, 64, 1), (torch.bfloat16, 12, 128, 3)]
)
def test_cascade_rotates_q_as_the_split_kernel(dtype, nh, d, prefix_splits, rtne_bf16, bf16_dot):
    """ROPE and WRITE on (q and the new k unrotated, views of one fused q/k/v row as attn_in makes them):
    the cache is the plain kernel's bit for bit, the output agrees (fp32: to rounding, bf16: loosely, the
    probabilities being rounded to bf16 against other maxima) and matches apply_rope then torch."""
    from ascent.rollout.fast.attention import decode_attention_torch
    from ascent.rollout.fast.layers import apply_rope
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    kvh = 2
    _, kc, vc, bt, ctx, table, _ = scene(GROUPS[:3], [0, 21], nh, kvh, d, 16, dtype, seed=4)
    b = len(ctx)
    g = torch.Generator().manual_seed(5)
    qkv = (torch.randn(b, (nh + 2 * kvh) * d, generator=g) * 2).to(dtype)
    q, k, v = (t.view(b, -1, d) for t in qkv.split((nh * d, kvh * d, kvh * d), dim=-1))
    cos, sin = rope_tables(ctx, d)
    kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    got = cascade_decode_attention(
        q, kc1, vc1, bt, ctx, d**-0.5, table, (k, v), 2, 16, rope=(cos, sin), prefix_splits=prefix_splits
    )
    plain = paged_decode_attention(q, kc2, vc2, bt, ctx, d**-0.5, (k, v), 2, 16, rope=(cos, sin))
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    live = ctx > 0
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got[live].float(), plain[live].float(), atol=tol, rtol=0)
    qr = apply_rope(q, cos, sin, dtype)
    want = decode_attention_torch(qr.float(), kc2.float(), vc2.float(), bt, ctx, bt.shape[1] * 16, d**-0.5)
    assert torch.allclose(got[live].float(), want[live], atol=tol, rtol=0)


def test_cascade_bf16_matches_torch(rtne_bf16, bf16_dot):
    """bf16 inputs, several prefix splits: close to the fp32 torch reference of the same bf16 values."""
    from ascent.rollout.fast.attention import decode_attention_torch
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention

    q, kc, vc, bt, ctx, table, _ = scene(GROUPS, [9, 0], 14, 2, 64, 16, torch.bfloat16, seed=6)
    got = cascade_decode_attention(q, kc, vc, bt, ctx, 0.125, table, None, 3, 16, prefix_splits=4)
    want = decode_attention_torch(q.float(), kc.float(), vc.float(), bt, ctx, bt.shape[1] * 16, 0.125)
    live = ctx > 0
    assert torch.allclose(got[live].float(), want[live], atol=2e-2, rtol=0)


def test_engine_with_shared_prefix_samples_what_it_samples_without(fast_tiny_path):
    """The engine on the Triton kernels (fp32, eager), shared_prefix on and off: prompts of two to three
    full pages with 2 to 4 samples each, samples finishing at different steps, more samples than rows (rows
    are released and reused by other prompts' samples while others still run, and compacted): the same
    tokens, logprobs equal to rounding, and groups were really formed."""
    from ascent.messages import GenerationRequest, SamplingParams
    from ascent.rollout.fast import build_fast_engine
    from ascent.rollout.fast.state import DecodeState

    g = torch.Generator().manual_seed(7)
    reqs = [
        GenerationRequest(
            torch.randint(4, 60, (n,), generator=g).tolist(),
            SamplingParams(max_new_tokens=m, n=k, seed=11 + i, temperature=t),
            request_id=i,
        )
        for i, (n, k, t, m) in enumerate([(37, 4, 1.0, 6), (33, 3, 0.0, 4), (50, 2, 1.0, 8), (20, 1, 1.0, 3)])
    ]
    seen = []
    regroup = DecodeState._regroup

    def spy(self):
        regroup(self)
        seen.append(sum(row[1] > 0 for row in self._packed))

    def run(shared: bool) -> list:
        engine = build_fast_engine(
            model_path=fast_tiny_path,
            dtype="fp32",
            device="cpu",
            page_size=16,
            max_model_len=80,
            max_batch_size=6,
            attention="triton",
            sampler="torch",
            attn_options={"shared_prefix": shared, "splits": 2},
        )
        assert engine.runner.shared_prefix == shared and (engine.state.groups is not None) == shared
        out = [[(s.token_ids, s.logprobs) for s in out] for out in engine.generate(reqs)]
        assert engine.stats["compactions"] > 0
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DecodeState, "_regroup", spy)
        on = run(True)
    off = run(False)
    assert max(seen) >= 2 and seen[-1] == 0  # several groups at once; none left at the end
    for a, b in zip(on, off, strict=True):
        for (ta, la), (tb, lb) in zip(a, b, strict=True):
            assert ta == tb
            assert np.allclose(la, lb, atol=1e-4)


def test_tensor_parallel_ranks_share_the_groups(tmp_path):
    """Two tensor-parallel ranks (gloo, the other forked: it interprets the kernels too), each with one of
    the two KV heads, shared_prefix on: the group table reaches rank 1 with the step's inputs, and the
    tokens are those of one process without the option (logprobs to rounding)."""
    from ascent.messages import GenerationRequest, SamplingParams
    from ascent.models import make_tiny_checkpoint
    from ascent.rollout.fast import TPEngine, build_fast_engine

    path = make_tiny_checkpoint(tmp_path / "tp", tie_word_embeddings=False, seed=1)
    g = torch.Generator().manual_seed(9)
    reqs = [
        GenerationRequest(
            torch.randint(4, 40, (p,), generator=g).tolist(),
            SamplingParams(temperature=0.0, max_new_tokens=m, n=n),
            request_id=i,
        )
        for i, (p, n, m) in enumerate([(19, 3, 6), (26, 2, 8), (9, 2, 5)])
    ]
    kw = dict(model_path=path, dtype="fp32", device="cpu", page_size=8, max_model_len=48, max_batch_size=8)
    kw |= dict(attention="triton", sampler="torch")
    engine = build_fast_engine(**kw, tensor_parallel=2, attn_options={"shared_prefix": True})
    assert isinstance(engine, TPEngine) and engine.state.groups is not None
    try:
        tp2 = [[(s.token_ids, s.logprobs) for s in out] for out in engine.generate(reqs)]
    finally:
        engine.shutdown()
    assert [c.exitcode for c in engine.children] == [0]
    plain = build_fast_engine(**kw, attn_options={"shared_prefix": False})
    one = [[(s.token_ids, s.logprobs) for s in out] for out in plain.generate(reqs)]
    for a, b in zip(tp2, one, strict=True):
        for (ta, la), (tb, lb) in zip(a, b, strict=True):
            assert ta == tb
            assert np.allclose(la, lb, atol=1e-4)
