"""GPU checks of the fast engine's fused pieces (skipped without CUDA), compiled as the engine runs them:

- the folded residual add (layers.py): the layer stack's hidden states equal the unfolded arithmetic's bit
  for bit (tests/unit/rollout_fast/test_fast_residual_fold.py, on CUDA);
- RoPE in the Triton decode kernel (`fused_rope`, triton_decode.py, on by default for bf16 weights): with
  CUDA graphs and torch.compile, greedy and sampled tokens and their logprobs equal those of RoPE in
  attn_in. fp16 and fp32 weights keep RoPE in attn_in (a run gave other tokens: an ulp apart, runner.py).
"""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine
from tests.unit.rollout_fast.test_fast_residual_fold import check_fold

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("gpu_fusions"),
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=False,
        seed=3,
    )


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_folded_residual_is_bit_identical_compiled_on_cuda(ckpt, dtype):
    check_fold(ckpt, dtype, compile=True, device="cuda")


def test_rope_in_the_decode_kernel_samples_what_rope_in_attn_in_samples(ckpt):
    dtype = "bf16"
    g = torch.Generator().manual_seed(0)
    reqs = [
        GenerationRequest(
            torch.randint(4, 60, (n,), generator=g).tolist(),
            SamplingParams(temperature=t, max_new_tokens=24, n=k, seed=i),
            request_id=i,
        )
        for i, (n, k, t) in enumerate([(5, 1, 0.0), (17, 3, 1.0), (33, 2, 0.0), (3, 4, 1.0)])
    ]

    def run(fused: bool | None) -> list:
        fast = build_fast_engine(
            model_path=ckpt,
            dtype=dtype,
            device="cuda",
            max_model_len=256,
            kv_cache_tokens=16384,
            max_batch_size=4,
            attn_options=None if fused is None else {"fused_rope": fused},
        )
        assert fast.graphs is not None and fast.runner.rotates_in_kernel() == (fused is not False)
        return [[(s.token_ids, s.logprobs) for s in out] for out in fast.generate(reqs)]

    assert run(None) == run(False)  # the default rotates in the kernel


def test_fp32_weights_keep_rope_in_attn_in(ckpt):
    """fp32 engines rotate in attn_in even when asked (runner.FUSED_ROPE: an ulp apart on GPUs)."""
    fast = build_fast_engine(
        model_path=ckpt,
        dtype="fp32",
        device="cuda",
        max_model_len=256,
        kv_cache_tokens=4096,
        max_batch_size=4,
    )
    assert not fast.runner.rotates_in_kernel()
