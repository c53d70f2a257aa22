"""GPU checks of prefix caching and the batch-invariant mode of the fast engine (skipped without CUDA).

- prefix caching under CUDA graphs, the Triton decode and paged-prefill kernels: greedy tokens equal those
  without it (fp32), the shared prefix is prefilled once, and a small cache evicts without changing them.
- batch-invariant mode (fp32 and bf16): a seeded request samples bitwise what it samples alone.
Not yet run on a GPU (written for the merger; CPU counterparts: tests/unit/rollout_fast/test_fast_prefix_cache.py).
"""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
SYSTEM = [4 + i % 85 for i in range(136)]  # 136 tokens (the tiny vocabulary has 89): two full pages of 64


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("gpu_tiny_prefix"),
        hidden_size=128,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=False,
        seed=3,
    )


def _engine(ckpt, dtype="fp32", **kw):
    kw.setdefault("kv_cache_tokens", 16384)
    fast = build_fast_engine(model_path=ckpt, dtype=dtype, device="cuda", max_model_len=512, **kw)
    fast.update_weights([("lm_head.weight", fast.weights.lm_head.detach().float() * 10.0)])
    return fast


def _requests(k, seed=0, system=SYSTEM, temperature=0.0):
    g = torch.Generator().manual_seed(seed)
    return [
        GenerationRequest(
            system + torch.randint(4, 89, (11 + 7 * i,), generator=g).tolist(),
            SamplingParams(temperature=temperature, max_new_tokens=24, n=1 + i % 3, seed=i),
            request_id=i,
        )
        for i in range(k)
    ]


def _tokens(out):
    return [g.token_ids for r in out for g in r]


def test_prefix_caching_keeps_greedy_tokens_under_graphs(ckpt):
    plain, cached = _engine(ckpt), _engine(ckpt, prefix_caching=True)
    reqs = _requests(6)
    assert _tokens(cached.generate(reqs)) == _tokens(plain.generate(reqs))
    assert cached.stats["prefix_hit_tokens"] == 5 * 128
    assert cached.stats["prefill_tokens"] == plain.stats["prefill_tokens"] - 5 * 128
    small = _engine(ckpt, prefix_caching=True, kv_cache_tokens=10 * 64, max_batch_size=4)
    for seed in range(6):  # distinct system prompts: the older ones' pages are evicted
        system = torch.randint(4, 89, (130,), generator=torch.Generator().manual_seed(seed)).tolist()
        reqs = _requests(4, seed=seed, system=system)
        assert _tokens(small.generate(reqs)) == _tokens(plain.generate(reqs))
    assert small.prefix.evicted > 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_batch_invariant_request_alone_equals_batched(ckpt, dtype):
    engine = _engine(ckpt, dtype, batch_invariant=True, max_batch_size=8)
    reqs = _requests(5, seed=1, system=[], temperature=1.0)
    together = engine.generate(reqs)
    for i, req in enumerate(reqs):
        alone = engine.generate([req])[0]
        assert [(g.token_ids, g.logprobs) for g in alone] == [(g.token_ids, g.logprobs) for g in together[i]]
