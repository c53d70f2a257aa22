"""`SamplingParams.allowed_token_ids` (a VLA's action tokens, `rollout.action_token_ids`) on the fast engine:
only those ids are sampled, a turn of max_new_tokens of them ends "stop", rows with and without allowed ids
share steps, prompts fed into a running batch are masked too, and tokens and logprobs (of the unfiltered
distribution) are the reference engine's for the same seeds."""

from __future__ import annotations

import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout.fast.live import fits
from ascent.rollout.fast.state import Flags

ACTIONS = (20, 21, 22, 23)


def _requests(seed: int, n: tuple[int, ...], restricted: tuple[bool, ...]) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(seed)
    return [
        GenerationRequest(
            torch.randint(4, 60, (5 + 7 * i,), generator=g).tolist(),
            SamplingParams(
                temperature=1.0,
                max_new_tokens=4 if r else 16,  # free rows outlast action turns: others join
                n=k,
                seed=100 + i,
                allowed_token_ids=ACTIONS if r else (),
            ),
            request_id=i,
        )
        for i, (k, r) in enumerate(zip(n, restricted, strict=True))
    ]


def _check_same(fast_out, ref_out, reqs) -> None:
    """Same tokens and finish reasons as the reference engine, logprobs to 1e-4; restricted rows hold only
    action tokens and end "stop", the others sample outside them (the mask is per row)."""
    free_tokens = set()
    for req, fast_gens, ref_gens in zip(reqs, fast_out, ref_out, strict=True):
        for f, r in zip(fast_gens, ref_gens, strict=True):
            assert (f.token_ids, f.finish_reason) == (r.token_ids, r.finish_reason)
            torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(r.logprobs), atol=1e-4, rtol=0)
            if req.params.allowed_token_ids:
                assert set(f.token_ids) <= set(ACTIONS) and len(f.token_ids) == 4
                assert f.finish_reason == "stop"
            else:
                free_tokens |= set(f.token_ids)
    assert free_tokens - set(ACTIONS), "the unrestricted rows were masked too"


def test_allowed_ids_sample_like_the_reference_engine_in_a_mixed_batch(engines):
    """Prefilled groups (n > 1) and rows that join as others finish (max_batch_size 4 < 9 samples)."""
    ref, fast = engines(max_batch_size=4, feed_prompt_tokens=0)
    reqs = _requests(seed=3, n=(3, 1, 2, 3), restricted=(True, False, True, False))
    out = fast.generate(reqs)
    _check_same(out, ref.generate(reqs), reqs)
    # the logprob is the unfiltered distribution's: the action tokens' probabilities do not sum to 1
    assert sum(lp for g in out[0] for lp in g.logprobs) < -1.0


def test_fed_action_turns_are_masked_too(engines):
    """Single-sample requests fed into a running batch (their prompt computed by decode steps) sample their
    first action token in a decode step: the row's mask applies there as well."""
    ref, fast = engines(max_batch_size=2, feed_prompt_tokens=64)
    reqs = _requests(seed=4, n=(1, 1, 1, 1), restricted=(True, False, True, True))
    out = fast.generate(reqs)
    assert fast.stats["fed_tokens"] > 0
    _check_same(out, ref.generate(reqs), reqs)


def test_a_live_call_takes_restricted_requests_only_when_its_graphs_mask() -> None:
    free = SamplingParams(temperature=1.0)
    action = SamplingParams(temperature=1.0, allowed_token_ids=ACTIONS)
    assert Flags.of([free, action]).restricted and not Flags.of([free]).restricted
    assert not fits(Flags.of([free]), action) and fits(Flags.of([action]), free)
