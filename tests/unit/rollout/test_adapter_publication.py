"""LoRA adapter-only publication (`ascent.rollout.adapter`): an engine that receives a LoRA policy's adapters
(lora_A, lora_B, lora_scaling per adapted layer) generates exactly what it generates after the full merged
publication, both engines, over two publications (the second merges into the pristine base, not on top of
the first), also when it arrives in link buckets through a reused buffer; and the bytes published are the
adapter's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout import build_engine
from ascent.trainer import LoraSettings, PolicyWorker
from ascent.transport.buckets import batched, pack, unpack

pytest.importorskip("peft")

RANK = 4


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread is several times faster on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def lora_policy(tiny_path):
    """A LoRA policy on every linear projection of the tiny Qwen2 (fused qkv and gate_up in the fast
    engine)."""
    return PolicyWorker(tiny_path, device="cpu", lora=LoraSettings(rank=RANK, alpha=8.0), seed=0)


def _set_adapters(policy, seed: int) -> None:
    """Nonzero adapters (a fresh LoRA's B is 0: it would change nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def _engine(path, name: str):
    kw = {"page_size": 16, "max_model_len": 64} if name == "fast" else {}
    return build_engine(name, model_path=path, device="cpu", dtype="fp32", **kw)


def _generate(engine):
    reqs = [
        GenerationRequest(list(range(4, 4 + n)), SamplingParams(max_new_tokens=8, n=2, seed=n))
        for n in (5, 17)
    ]
    gens = [g for gs in engine.generate(reqs) for g in gs]
    return [g.token_ids for g in gens], [g.logprobs for g in gens]


@pytest.mark.parametrize("engine_name", ["reference", "fast"])
def test_adapter_only_publication_equals_the_merged_one(tiny_path, lora_policy, engine_name):
    merged, adapter, base = (_engine(tiny_path, engine_name) for _ in range(3))
    for seed in (1, 2):
        _set_adapters(lora_policy, seed)
        merged.update_weights(lora_policy.named_weights())
        adapter.update_weights(lora_policy.adapter_weights())
        got, want = _generate(adapter), _generate(merged)
        assert got == want  # tokens and logprobs, exactly: the same merge on the same device
        assert want[1] != _generate(base)[1]  # the adapters did change the policy
    assert len(adapter.adapters.base) == 2 * 7  # pristine copies of the adapted layers, kept from the first


def test_adapter_in_link_buckets(tiny_path, lora_policy):
    """Over a link the adapter comes in buckets through one reused buffer (`ascent.transport.buckets`): a
    layer's parts split over buckets wait for each other, and the engine ends where one call leaves it."""
    _set_adapters(lora_policy, 3)
    whole, bucketed = _engine(tiny_path, "fast"), _engine(tiny_path, "fast")
    whole.update_weights(lora_policy.adapter_weights())
    buffer = torch.empty(4096, dtype=torch.uint8)
    buckets = list(batched(lora_policy.adapter_weights(), 3000))
    assert any(b[-1][0].endswith(("lora_A", "lora_B")) for b in buckets)  # some layer's parts are split
    with bucketed.publication():
        for bucket in buckets:
            bucketed.update_weights(unpack(buffer, pack(bucket, buffer)))
    assert _generate(bucketed) == _generate(whole)


def test_published_bytes_are_the_adapters(lora_policy, tiny_path):
    """Tiny Qwen2: hidden 64, intermediate 256, 4 heads of 16, 2 KV heads, 2 layers; fp32 adapters."""
    h, inter, kv, layers = 64, 256, 2 * 16, 2
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]  # q k v o gate up down
    per_layer = sum(RANK * (i + o) * 4 + 8 for i, o in shapes)  # A [r, in] + B [out, r] fp32, fp64 scaling
    adapter = sum(t.numel() * t.element_size() for _, t in lora_policy.adapter_weights())
    full = sum(t.numel() * t.element_size() for _, t in lora_policy.named_weights())
    assert adapter == layers * per_layer == 45168
    assert full > 10 * adapter
    # model.lora.publish=adapter: what every publication path sends (TrainerWorker.named_weights/send_weights)
    lora_policy.lora = replace(lora_policy.lora, publish_adapter=True)
    try:
        assert [n for n, _ in lora_policy.named_weights()] == [n for n, _ in lora_policy.adapter_weights()]
    finally:
        lora_policy.lora = replace(lora_policy.lora, publish_adapter=False)
