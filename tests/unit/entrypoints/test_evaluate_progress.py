"""`ascent eval` generates in parts of whole batches with a progress line after each, and the generations
are those of one call, in order."""

from __future__ import annotations

import pytest

from ascent.entrypoints.evaluate import generate_with_progress
from ascent.messages import Generation, GenerationRequest, SamplingParams


class CountingEngine:
    """Answers each request with its own prompt; records the size of every generate call."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        self.calls.append(len(requests))
        return [[Generation(list(r.prompt_ids), [0.0] * len(r.prompt_ids), "length")] for r in requests]


def test_generation_in_parts_prints_progress_and_keeps_the_order(capsys: pytest.CaptureFixture[str]) -> None:
    params = SamplingParams(max_new_tokens=2)
    requests = [GenerationRequest([i, i + 1], params, request_id=i) for i in range(130)]
    engine = CountingEngine()
    gens = generate_with_progress(engine, requests, batch_size=4)  # type: ignore[arg-type]
    assert [g[0].token_ids for g in gens] == [[i, i + 1] for i in range(130)]
    assert engine.calls == [8] * 16 + [2]  # whole batches of 4, about 20 parts
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("it 1/17 | ") and "tok/s" in lines[0] and lines[-1].startswith("it 17/17 | ")
