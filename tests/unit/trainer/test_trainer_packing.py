"""Packing: micro-batch planning under a token budget, the packed layout, and packed == separate forwards."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trainer_helpers import make_samples, naive_logprobs

from ascent.trainer.logprobs import token_logprobs
from ascent.trainer.packing import pack, plan_micro_batches, to_device


def test_plan_respects_budget_and_covers_every_sequence():
    lengths = [7, 3, 9, 1, 4, 4, 10, 2]
    plan = plan_micro_batches(lengths, max_tokens=10)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in mb) <= 10 for mb in plan)
    assert len(plan) == 4  # 40 tokens, budget 10: first-fit-decreasing packs them perfectly


def test_plan_single_batch_and_empty():
    assert plan_micro_batches([3, 4, 5], max_tokens=100) == [[0, 1, 2]]
    assert plan_micro_batches([], max_tokens=10) == []


def test_plan_too_long_sequence_names_the_field():
    with pytest.raises(ValueError, match=r"train\.max_tokens_per_micro_batch=8.*sequence 1 has 9 tokens"):
        plan_micro_batches([3, 9], max_tokens=8)


def test_pack_layout():
    samples = make_samples(3, seed=1)
    packed = pack(samples)
    n = sum(s.num_tokens for s in samples)
    m = sum(len(s.response_ids) for s in samples)
    assert packed.input_ids.shape == (1, n) and packed.position_ids.shape == (1, n)
    for name in ("logit_index", "targets", "loss_mask", "advantages", "seq_ids", "old_logprobs"):
        assert getattr(packed, name).shape == (m,), name
    # every target is the token right after the logit that predicts it; positions restart per sequence
    assert torch.equal(packed.input_ids[0, packed.logit_index + 1], packed.targets)
    starts = [0]
    for s in samples[:-1]:
        starts.append(starts[-1] + s.num_tokens)
    assert all(packed.position_ids[0, st] == 0 for st in starts)
    assert packed.seq_ids.tolist() == [i for i, s in enumerate(samples) for _ in s.response_ids]
    assert packed.split(packed.advantages) == [pytest.approx(s.advantages) for s in samples]


def test_to_device_moves_every_tensor_and_keeps_the_rest():
    """Every tensor field goes (a field added to PackedBatch later goes too), host-side fields stay as
    they are; "meta" stands in for an accelerator on this CPU machine."""
    packed = pack(make_samples(3, seed=2))
    moved = to_device(packed, "meta")
    for name, value in vars(packed).items():
        if isinstance(value, torch.Tensor):
            assert moved.__dict__[name].device.type == "meta", name
            assert moved.__dict__[name].shape == value.shape and moved.__dict__[name].dtype == value.dtype
        else:
            assert moved.__dict__[name] == value, name
    assert to_device(packed, "cpu") is packed


def test_pack_missing_optional_field_gives_none():
    samples = make_samples(2, with_old=False)
    assert pack(samples).old_logprobs is None


def test_pack_rejects_empty_prompt_and_misaligned_fields():
    s = replace(make_samples(1)[0], prompt_ids=[])
    with pytest.raises(ValueError, match="empty prompt_ids"):
        pack([s])
    s = make_samples(1)[0]
    s = replace(s, advantages=s.advantages[:-1])
    with pytest.raises(ValueError, match="advantages has"):
        pack([s])


@torch.no_grad()
def test_packed_forward_equals_separate_forwards(tiny_model):
    samples = make_samples(8, seed=3)
    packed = pack(samples)
    lp, _ = token_logprobs(tiny_model, packed, temperature=0.8)
    expected = torch.cat([naive_logprobs(tiny_model, s, 0.8) for s in samples])
    torch.testing.assert_close(lp, expected, atol=1e-5, rtol=0)
    # sanity: without the position-id restarts, attention leaks across sequences and results differ
    packed.position_ids = torch.arange(packed.num_tokens)[None]
    leaked, _ = token_logprobs(tiny_model, packed, temperature=0.8)
    assert (leaked - expected).abs().max() > 1e-3
