"""GPU check of ascent.models.varlen (skipped without CUDA): flash varlen attention on packed rows gives the
same hidden states and gradients as transformers' SDPA path with its dense block-causal mask."""

from __future__ import annotations

import pytest
import torch

from ascent.models import varlen

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not varlen.available(), reason="needs CUDA and torch's varlen_attn"),
]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("heads,kv_heads,hidden", [(8, 2, 256), (12, 2, 1536)])
def test_varlen_matches_sdpa_forward_and_backward(tmp_path, heads, kv_heads, hidden):
    from transformers import AutoModelForCausalLM

    from ascent.models.tiny import make_tiny_checkpoint
    from ascent.trainer.logprobs import token_logprobs
    from ascent.trainer.packing import pack
    from ascent.types import TrainSample

    path = make_tiny_checkpoint(tmp_path / "m", hidden_size=hidden, num_layers=2, num_heads=heads,
                                num_kv_heads=kv_heads, max_position_embeddings=1024)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    samples = [
        TrainSample(prompt_ids=torch.randint(3, 80, (p,), generator=g).tolist(),
                    response_ids=torch.randint(3, 80, (r,), generator=g).tolist(),
                    loss_mask=[1] * r, advantages=[1.0] * r)
        for p, r in ((100, 300), (7, 1), (256, 512), (33, 90))
    ]  # fmt: skip

    def run(attn: str):
        model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").cuda()
        if attn == "varlen":
            assert varlen.enable_varlen_attention(model)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lp, _ = token_logprobs(model, pack(samples, "cuda"))
        lp.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return lp.detach(), grads

    lp_ref, g_ref = run("sdpa")
    lp, g_var = run("varlen")
    assert (lp - lp_ref).abs().mean() < 2e-2
    assert _rel(g_var, g_ref) < 5e-2
