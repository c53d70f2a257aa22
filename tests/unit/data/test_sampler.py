"""PromptSampler: seeded epoch-wise shuffling, batches across epoch boundaries, exact resume."""

from __future__ import annotations

import pytest

from ascent.data import PromptSampler


def take(sampler: PromptSampler, n: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(n)]


def test_same_seed_same_order_other_seed_differs():
    assert take(PromptSampler(50, 8, seed=3), 10) == take(PromptSampler(50, 8, seed=3), 10)
    assert take(PromptSampler(50, 8, seed=3), 10) != take(PromptSampler(50, 8, seed=4), 10)


def test_every_epoch_is_a_permutation_and_epochs_differ():
    sampler = PromptSampler(12, 4, seed=0)
    epoch0 = sum(take(sampler, 3), [])
    epoch1 = sum(take(sampler, 3), [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(12))
    assert epoch0 != epoch1


def test_batches_span_epoch_boundaries():
    sampler = PromptSampler(5, 3, seed=1)
    flat = sum(take(sampler, 4), [])  # 12 indices: 2 full epochs and part of a third
    assert sorted(flat[:5]) == sorted(flat[5:10]) == list(range(5))
    assert sampler.epoch == 2 and sampler.position == 2


def test_batch_larger_than_dataset():
    sampler = PromptSampler(3, 7, shuffle=False)
    assert sampler.next_batch() == [0, 1, 2, 0, 1, 2, 0]


def test_no_shuffle_is_in_order():
    assert take(PromptSampler(4, 2, shuffle=False), 3) == [[0, 1], [2, 3], [0, 1]]


@pytest.mark.parametrize("k", [0, 1, 3, 5, 6])
def test_resume_continues_exactly(k):
    reference = PromptSampler(10, 4, seed=7)
    expected = take(reference, k + 6)[k:]
    first = PromptSampler(10, 4, seed=7)
    take(first, k)
    state = first.state_dict()
    resumed = PromptSampler(10, 4, seed=7)
    resumed.load_state_dict(dict(state))
    assert take(resumed, 6) == expected


def test_resume_with_other_dataset_or_seed_fails():
    state = PromptSampler(10, 4, seed=7).state_dict()
    with pytest.raises(ValueError, match="num_items=10 but this sampler has num_items=11"):
        PromptSampler(11, 4, seed=7).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=7 but this sampler has seed=8"):
        PromptSampler(10, 4, seed=8).load_state_dict(state)


def test_empty_dataset_rejected():
    with pytest.raises(ValueError, match="num_items=0"):
        PromptSampler(0, 4)
