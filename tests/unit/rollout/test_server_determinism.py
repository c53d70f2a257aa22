"""A seeded request through the server's batcher gets the same tokens and logprobs, bit for bit, whether it
ran alone or was queued with other requests (the reference engine, CPU): with `isolate_seeded` (what
`OpenAIServer` sets for the reference engine) the batcher gives it a call of its own, while unseeded requests
still share one; without it (other engines) they all share one."""

from __future__ import annotations

from collections.abc import Callable

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout import ReferenceEngine
from ascent.rollout.server import Batcher
from tests.unit.rollout.server_support import ScriptedEngine

SEEDED = GenerationRequest([5, 6, 7, 8], SamplingParams(temperature=1.0, max_new_tokens=24, n=2, seed=7))
OTHERS = [GenerationRequest(list(range(3, 3 + k)), SamplingParams(max_new_tokens=24)) for k in (1, 11, 20)]


def _together(
    batcher: Batcher, requests: list[GenerationRequest]
) -> list[list[tuple[list[int], list[float]]]]:
    """Queue all requests before the batcher takes any (so they could share a call); their samples."""
    with batcher._cond:  # held: the batcher thread cannot take the queue until all are in
        futures = [batcher.submit(r) for r in requests]
    return [[(g.token_ids, g.logprobs) for g in f.result(timeout=120).generations] for f in futures]


def test_a_seeded_request_is_the_same_alone_and_queued_with_others(
    make_engine: Callable[..., ReferenceEngine],
) -> None:
    batcher = Batcher(make_engine(), gather_s=0.05, isolate_seeded=True)
    batcher.start()
    try:
        (alone,) = _together(batcher, [SEEDED])
        mixed = _together(batcher, [OTHERS[0], SEEDED, *OTHERS[1:]])
    finally:
        batcher.close()
    assert mixed[1] == alone  # exact logprobs too: batched rows would differ in the last bits
    assert len(alone) == 2 and alone[0] != alone[1]  # its two samples differ (split seeds)


def test_seeded_requests_get_calls_of_their_own_and_the_rest_share_one() -> None:
    engine = ScriptedEngine(lambda r: [2, 1])
    batcher = Batcher(engine, gather_s=0.05, isolate_seeded=True)
    batcher.start()
    try:
        seeded = [GenerationRequest([4], SamplingParams(seed=s)) for s in (1, 2)]
        _together(batcher, [OTHERS[0], seeded[0], OTHERS[1], seeded[1], OTHERS[2]])
    finally:
        batcher.close()
    assert engine.batches == [3, 1, 1]
    shared = ScriptedEngine(lambda r: [2, 1])
    batcher = Batcher(shared, gather_s=0.05)
    batcher.start()
    try:
        _together(batcher, [OTHERS[0], seeded[0], seeded[1]])
    finally:
        batcher.close()
    assert shared.batches == [3]
