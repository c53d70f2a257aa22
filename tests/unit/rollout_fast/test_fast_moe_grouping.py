"""The routed MoE path's grouping of (token, slot) pairs by expert (`group_by_expert`): the counting sort of
decode steps gives the stable sort's permutation, its inverse and the experts' row ends exactly, for
random routings, empty experts, one token and every pair on one expert; the switch between the two sits
at `COUNTING_SORT_MAX`; and the routed layer's output is bit-identical whichever grouping ran."""

from __future__ import annotations

import pytest
import torch

from ascent.rollout.fast import moe
from ascent.rollout.fast.moe import (
    counting_group,
    experts_forward_routed,
    group_by_expert,
    route,
    sorting_group,
)


def _sort_reference(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the routed path computed before the counting sort: stable sort, inverse, searchsorted ends."""
    sorted_ids, order = torch.sort(ids, stable=True)
    slot = torch.empty_like(order)
    slot[order] = torch.arange(ids.numel())
    ends = torch.tensor([int((ids <= e).sum()) for e in range(num_experts)], dtype=torch.int32)
    return order, slot, ends


def _assert_grouping_exact(ids: torch.Tensor, num_experts: int) -> None:
    want = _sort_reference(ids, num_experts)
    for group in (counting_group, sorting_group):
        got = group(ids, num_experts)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w), group.__name__


@pytest.mark.parametrize(("n", "e", "seed"), [(1, 8, 0), (2, 4, 1), (64, 8, 2), (1024, 128, 3), (300, 7, 4)])
def test_counting_sort_is_the_stable_sorts_permutation_for_random_routes(n, e, seed):
    g = torch.Generator().manual_seed(seed)
    _assert_grouping_exact(torch.randint(0, e, (n,), generator=g), e)


def test_counting_sort_with_empty_experts_one_token_and_one_expert_for_all():
    _assert_grouping_exact(torch.tensor([5, 2]), 8)  # T=1, k=2: six experts empty
    _assert_grouping_exact(torch.tensor([3]), 8)  # T=1, k=1
    _assert_grouping_exact(torch.full((40,), 6), 8)  # every pair on one expert, the last one empty
    _assert_grouping_exact(torch.full((40,), 0), 8)  # every pair on expert 0: the rest empty
    _assert_grouping_exact(torch.tensor([7, 7, 0, 7, 0, 0, 7]), 8)  # only the first and last
    top8 = torch.stack(
        [torch.randperm(128, generator=torch.Generator().manual_seed(t))[:8] for t in range(16)]
    )
    _assert_grouping_exact(top8.reshape(-1), 128)  # a router's top-8 of 128 experts: distinct per token


def test_the_switch_counts_up_to_the_threshold_and_sorts_above(monkeypatch):
    calls = []
    monkeypatch.setattr(moe, "counting_group", lambda ids, e: calls.append("count") or counting_group(ids, e))
    monkeypatch.setattr(moe, "sorting_group", lambda ids, e: calls.append("sort") or sorting_group(ids, e))
    monkeypatch.setattr(moe, "COUNTING_SORT_MAX", 64)
    ids = torch.tensor([1, 0, 1, 3, 2, 0, 3, 1])
    for n, e, path in [(8, 8, "count"), (8, 9, "sort"), (16, 4, "count"), (13, 5, "sort")]:
        calls.clear()
        got = group_by_expert(ids.repeat(2)[:n] % e, e)
        assert calls == [path], (n, e)
        want = _sort_reference(ids.repeat(2)[:n] % e, e)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("t", "k"), [(1, 2), (5, 1), (17, 3), (64, 4)])
def test_routed_layer_is_bit_identical_counting_or_sorting(monkeypatch, t, k, dtype):
    g = torch.Generator().manual_seed(t * 10 + k)
    e, hid, inter = 8, 16, 12
    h = torch.randn(t, hid, generator=g).to(dtype)
    gate_up = (torch.randn(e, 2 * inter, hid, generator=g) / hid**0.5).to(dtype)
    down = (torch.randn(e, hid, inter, generator=g) / inter**0.5).to(dtype)
    ids, weights = route(torch.randn(t, e, generator=g).to(dtype), k, normalize=True)
    counted = experts_forward_routed(h, ids, weights, gate_up, down)
    monkeypatch.setattr(moe, "COUNTING_SORT_MAX", 0)  # every size sorts: the path before the counting sort
    sorted_ = experts_forward_routed(h, ids, weights, gate_up, down)
    assert counted.dtype == dtype and torch.equal(counted, sorted_)
