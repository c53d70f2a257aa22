"""The fast engine's forward on other architectures (Qwen3 q/k norm, Llama without biases), tied heads."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout import ReferenceEngine
from ascent.rollout.fast import build_fast_engine

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _model(kind: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    make = {
        "qwen3": lambda: Qwen3Config(head_dim=32, **COMMON),
        "llama": lambda: LlamaConfig(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            **COMMON,
        ),
        "qwen2_tied": lambda: Qwen2Config(tie_word_embeddings=True, **COMMON),
    }
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make[kind](), attn_implementation="sdpa").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2_tied"])
def test_greedy_equals_reference(kind):
    model = _model(kind)
    ref = ReferenceEngine(model, eos_token_ids=[1], pad_token_id=0)
    fast = build_fast_engine(
        model=model,
        dtype="fp32",
        device="cpu",
        eos_token_ids=[1],
        max_model_len=200,
        share_weights=False,
        page_size=16,
    )
    assert not fast.weights.shared
    g = torch.Generator().manual_seed(0)
    reqs = [
        GenerationRequest(
            torch.randint(2, 96, (n,), generator=g).tolist(),
            SamplingParams(temperature=0.0, max_new_tokens=24, n=2),
        )
        for n in (3, 40)
    ]
    want = [[g.token_ids for g in r] for r in ref.generate(reqs)]
    got = fast.generate(reqs)
    assert [[g.token_ids for g in r] for r in got] == want
