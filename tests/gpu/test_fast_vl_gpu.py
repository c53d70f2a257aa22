"""GPU check of the fast engine's vision-language path (skipped without CUDA): with CUDA graphs on, image
prompts decode with their rows' multimodal rope deltas inside the captured steps, so greedy tokens equal the
reference engine's (fp32, TF32 off) and logprobs agree, for Qwen2.5-VL and Qwen3-VL, n > 1 and a session's
second turn that adds an image."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import load_image_codec
from ascent.rollout import build_engine
from ascent.rollout.fast import build_fast_engine
from tests.unit.vl_support import VL_FAMILIES, image_prompt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("family", VL_FAMILIES)
def test_image_prompts_decode_under_cuda_graphs_as_the_reference_engine_does(family, tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    path = make_tiny_vl_checkpoint(tmp_path, family=family, seed=3)
    ref = build_engine("reference", model_path=path, device="cuda", dtype="fp32")
    fast = build_fast_engine(
        model_path=path, dtype="fp32", device="cuda", page_size=16, max_model_len=512, kv_cache_tokens=4096
    )
    codec, tok = load_image_codec(path), AutoTokenizer.from_pretrained(path)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    prompts = [image_prompt(codec, tok, k, seed=s) for k, s in ((1, 1), (2, 2), (0, 0))]
    reqs = [GenerationRequest(ids, greedy, request_id=i, images=ims) for i, (ids, ims) in enumerate(prompts)]
    fast_out, ref_out = fast.generate(reqs), ref.generate(reqs)
    for f, g in zip(fast_out, ref_out, strict=True):
        assert f[0].token_ids == g[0].token_ids
        diff = (torch.tensor(f[0].logprobs) - torch.tensor(g[0].logprobs)).abs().max().item()
        assert diff < 1e-3, diff
    # a session's next turn shows one more image: its positions continue from the cached turn's
    ids1, ims1 = prompts[0]
    turn1 = GenerationRequest(ids1, greedy, session_id="s", images=ims1)
    (gen1,) = fast.generate([turn1])[0]
    ids2, ims2 = image_prompt(codec, tok, 1, seed=5)
    turn2 = GenerationRequest(ids1 + gen1.token_ids + ids2, greedy, session_id="s", images=ims1 + ims2)
    (f2,) = fast.generate([turn2])[0]
    (g2,) = ref.generate([turn2])[0]
    assert f2.cached_tokens > 0 and f2.token_ids == g2.token_ids
