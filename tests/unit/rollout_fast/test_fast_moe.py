"""The fast engine on a Qwen3-MoE: its routed-experts layer (`ascent.rollout.fast.moe`) samples what
transformers' model samples, from a checkpoint saved per expert (owned, stacked weights) and from the
trainer's module (shared, stacked), and takes the trainer's publications (stacked names)."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import load_model
from ascent.models.tiny import make_tiny_moe_checkpoint
from ascent.rollout import ReferenceEngine
from ascent.rollout.fast import build_fast_engine


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return make_tiny_moe_checkpoint(tmp_path_factory.mktemp("moe_fast"), expert_scale=10.0, seed=2)


def _requests():
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=12, n=2, seed=7)
    return [GenerationRequest(torch.randint(4, 80, (n,), generator=g).tolist(), params) for n in (3, 25)]


def _tokens_and_logprobs(outs):
    return [g.token_ids for gs in outs for g in gs], [g.logprobs for gs in outs for g in gs]


@pytest.mark.parametrize("share", [False, True])
def test_fast_engine_samples_what_transformers_samples(moe_path, share):
    model = load_model(moe_path, dtype="fp32", device="cpu")
    want_tokens, want_lp = _tokens_and_logprobs(ReferenceEngine(model, [1], 0).generate(_requests()))
    source = {"model": model} if share else {"model_path": moe_path}
    fast = build_fast_engine(**source, dtype="fp32", device="cpu", page_size=16, max_model_len=64)
    assert fast.weights.shared is share
    assert fast.weights.layers[0].down_w.shape == (8, 64, 32)  # stacked experts [E, H, I]
    tokens, lps = _tokens_and_logprobs(fast.generate(_requests()))
    assert tokens == want_tokens
    for a, b in zip(lps, want_lp, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


def test_publication_of_the_trainers_stacked_experts(moe_path):
    fast = build_fast_engine(model_path=moe_path, dtype="fp32", device="cpu", page_size=16, max_model_len=64)
    trainer = load_model(moe_path, dtype="fp32", device="cpu")
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if ".mlp." in name:
                p.mul_(1.5)  # a changed router and changed experts
    names = dict(trainer.named_parameters())
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and "model.layers.0.mlp.gate.weight" in names
    fast.update_weights(names.items())
    want, _ = _tokens_and_logprobs(ReferenceEngine(trainer, [1], 0).generate(_requests()))
    got, _ = _tokens_and_logprobs(fast.generate(_requests()))
    assert got == want
