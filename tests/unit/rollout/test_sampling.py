"""Tests for ascent.rollout.sampling: filter masks on hand cases, greedy, logprob convention, seeding, and
that sampled frequencies match softmax(logits / T)."""

from __future__ import annotations

import math

import torch

from ascent.messages import SamplingParams
from ascent.rollout.sampling import (
    SamplingTensors,
    apply_repetition_penalty,
    min_p_mask,
    sample,
    split_seed,
    token_presence,
    top_k_top_p_mask,
    uniform_noise,
)


def _logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor([probs]).log()


def _tensors(params: list[SamplingParams], seeds: list[int] | None = None) -> SamplingTensors:
    return SamplingTensors.from_params(params, seeds if seeds is not None else list(range(len(params))))


def _masks(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> list[bool]:
    removed = top_k_top_p_mask(logits, torch.tensor([top_k]), torch.tensor([top_p]))
    return removed[0].tolist()


def test_top_k_mask_keeps_k_largest_anywhere_in_vocab() -> None:
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]])
    assert _masks(logits, top_k=2) == [True, False, True, False]
    assert _masks(logits, top_k=1) == [True, False, True, True]
    assert _masks(logits, top_k=0) == [False] * 4
    assert _masks(logits, top_k=10) == [False] * 4


def test_top_p_mask_keeps_smallest_set_reaching_mass() -> None:
    logits = _logits_of([0.15, 0.5, 0.05, 0.3])
    assert _masks(logits, top_p=0.7) == [True, False, True, False]  # 0.5 + 0.3 >= 0.7
    assert _masks(logits, top_p=0.9) == [False, False, True, False]  # needs 0.95
    assert _masks(logits, top_p=0.3) == [True, False, True, True]  # top token always kept
    assert _masks(logits, top_p=1.0) == [False] * 4


def test_top_p_applies_to_top_k_renormalised_mass() -> None:
    logits = _logits_of([0.4, 0.3, 0.2, 0.1])
    # Alone, top-p 0.5 keeps 0.4 and 0.3 (mass above 0.3 is 0.4 < 0.5).
    assert _masks(logits, top_p=0.5) == [False, False, True, True]
    # After top-2 the mass is 4/7, 3/7, so 4/7 >= 0.5 already and only the first token stays.
    assert _masks(logits, top_k=2, top_p=0.5) == [False, True, True, True]


def test_min_p_mask_is_relative_to_top_probability() -> None:
    logits = _logits_of([0.1, 0.5, 0.3, 0.1])
    removed = min_p_mask(logits, torch.tensor([0.25]))  # threshold 0.125
    assert removed[0].tolist() == [True, False, False, True]
    assert not min_p_mask(logits, torch.tensor([0.0])).any()


def test_per_row_parameters_in_one_batch() -> None:
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]] * 3)
    removed = top_k_top_p_mask(logits, torch.tensor([0, 1, 3]), torch.tensor([1.0, 1.0, 1.0]))
    assert removed.sum(dim=-1).tolist() == [0, 3, 1]


def test_greedy_returns_argmax_and_unit_temperature_logprob() -> None:
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    st = _tensors([SamplingParams(temperature=0.0)] * 6)
    tokens, logprobs = sample(logits, st, torch.zeros(6, dtype=torch.long))
    assert torch.equal(tokens, logits.argmax(-1))
    expected = logits.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, expected)


def test_logprob_is_before_filtering_with_temperature() -> None:
    logits = torch.tensor([[2.0, 0.5, 1.0, -1.0]])
    st = _tensors([SamplingParams(temperature=2.0, top_k=1)])
    tokens, logprobs = sample(logits, st, torch.zeros(1, dtype=torch.long))
    assert tokens.item() == 0  # top-1 leaves only the argmax
    expected = (logits / 2.0).log_softmax(-1)[0, 0]
    torch.testing.assert_close(logprobs[0], expected)
    assert logprobs[0].item() < -0.1  # not log(1) of the filtered distribution


def test_a_grammar_mask_limits_the_tokens_not_the_logprob() -> None:
    logits = torch.randn(8, 11, generator=torch.Generator().manual_seed(1))
    allowed = torch.zeros(8, 11, dtype=torch.bool)
    allowed[:, [3, 7]] = True
    allowed[7] = True  # a row without a grammar
    params = [SamplingParams(temperature=0.0)] * 2 + [SamplingParams(temperature=1.0, top_p=0.9)] * 6
    tokens, logprobs = sample(logits, _tensors(params), torch.zeros(8, dtype=torch.long), allowed=allowed)
    assert all(t in (3, 7) for t in tokens[:7].tolist())
    assert tokens[0].item() == (3 if logits[0, 3] > logits[0, 7] else 7)  # greedy: the best allowed token
    expected = logits.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)  # T = 1 for every row here
    torch.testing.assert_close(logprobs, expected)  # of the unmasked distribution


def test_mixed_greedy_and_sampled_rows() -> None:
    logits = torch.tensor([[0.0, 3.0, 0.0]] * 2)
    st = _tensors([SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1)])
    assert not st.all_greedy
    tokens, logprobs = sample(logits, st, torch.zeros(2, dtype=torch.long))
    assert tokens.tolist() == [1, 1]
    torch.testing.assert_close(logprobs[0], logprobs[1])


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_sampled_frequencies_match_softmax_over_temperature() -> None:
    n, temp = 40_000, 0.7
    base = torch.tensor([1.0, 0.2, -0.5, 0.8, -1.5])
    st = _tensors([SamplingParams(temperature=temp)] * n, seeds=list(range(n)))
    tokens, _ = sample(base.expand(n, 5), st, torch.zeros(n, dtype=torch.long))
    counts = torch.bincount(tokens, minlength=5).float()
    probs = (base / temp).softmax(-1)
    # 4 degrees of freedom: P(chi2 > 25) < 1e-4. Seeds are fixed, so the test is deterministic.
    assert _chi_square(counts, probs) < 25.0
    assert (counts / n - probs).abs().max() < 0.01


def test_sampled_frequencies_with_top_k_follow_renormalised_distribution() -> None:
    n = 20_000
    base = torch.tensor([1.0, 0.2, -0.5, 0.8, -1.5])
    st = _tensors([SamplingParams(temperature=1.0, top_k=3)] * n, seeds=[7 * i + 1 for i in range(n)])
    tokens, _ = sample(base.expand(n, 5), st, torch.full((n,), 5, dtype=torch.long))
    counts = torch.bincount(tokens, minlength=5).float()
    probs = torch.zeros(5)
    probs[[0, 1, 3]] = base[[0, 1, 3]].softmax(-1)
    assert counts[2] == 0 and counts[4] == 0
    assert _chi_square(counts, probs) < 20.0  # 2 degrees of freedom


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 50, generator=gen)
    params = [SamplingParams(temperature=1.0, top_p=0.9, min_p=0.01)] * 8
    seeds = [split_seed(123, i) for i in range(8)]
    steps = torch.arange(8)
    batched, batched_lp = sample(logits, _tensors(params, seeds), steps)
    for i in [0, 3, 7]:
        alone, alone_lp = sample(logits[i : i + 1], _tensors(params[:1], seeds[i : i + 1]), steps[i : i + 1])
        assert alone.item() == batched[i].item()
        assert alone_lp.item() == batched_lp[i].item()


def test_noise_varies_with_seed_and_step() -> None:
    seeds = torch.tensor([5, 5, 6])
    noise = uniform_noise(seeds, torch.tensor([0, 1, 0]), 1000)
    assert noise.min() > 0 and noise.max() < 1
    assert abs(noise.mean().item() - 0.5) < 0.02
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    assert torch.equal(noise[0], uniform_noise(torch.tensor([5]), torch.tensor([0]), 1000)[0])
    assert split_seed(5, 0) != split_seed(5, 1) != split_seed(6, 0)


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    seen = token_presence(torch.tensor([[0, 2, -1, -1]]), vocab_size=4)
    assert seen.tolist() == [[True, False, True, False]]
    logits = torch.tensor([[2.0, 2.0, -1.0, -1.0]])
    out = apply_repetition_penalty(logits, torch.tensor([2.0]), seen)
    assert out.tolist() == [[1.0, 2.0, -2.0, -1.0]]


def test_repetition_penalty_changes_greedy_choice_not_logprob() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    st = _tensors([SamplingParams(temperature=0.0, repetition_penalty=2.0)])
    seen = token_presence(torch.tensor([[0]]), vocab_size=3)
    tokens, logprobs = sample(logits, st, torch.zeros(1, dtype=torch.long), seen)
    assert tokens.item() == 1
    assert math.isclose(logprobs.item(), logits.log_softmax(-1)[0, 1].item(), rel_tol=1e-6)
