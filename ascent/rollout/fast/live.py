"""The bookkeeping of a live call (`FastEngine.generate_live`): requests that join while it runs.

`more(fits)` hands the call requests queued since its last step (those `fits` accepts: their sampling needs no
stage the call's CUDA graphs lack); `done(i, generations)` answers request i as soon as its samples end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ascent.messages import Generation, GenerationRequest
from ascent.rollout.fast.state import Flags

More = Callable[[Callable[[GenerationRequest], bool]], list[GenerationRequest]]
Done = Callable[[int, list[Generation]], None]


@dataclasses.dataclass
class LiveCall:
    """A live call's callbacks and bookkeeping: each request's samples so far and how many are missing."""

    more: More
    done: Done
    fits: Callable[[GenerationRequest], bool]
    out: list[list[Any]] = dataclasses.field(default_factory=list)
    left: list[int] = dataclasses.field(default_factory=list)

    def add(self, requests: list[GenerationRequest]) -> int:
        """Make room for the samples of `requests`, which joined the call -> the number of the first one."""
        start = len(self.out)
        self.out += [[None] * r.params.n for r in requests]
        self.left += [r.params.n for r in requests]
        return start

    def answer_ready(self, start: int) -> None:
        """Answer at once the requests from `start` on whose samples are all there (no room to generate)."""
        for i in range(start, len(self.out)):
            if all(g is not None for g in self.out[i]):
                self.left[i] = 0
                self.done(i, self.out[i])

    def finished(self, req: int, sample: int, generation: Generation) -> None:
        """Sample `sample` of request `req` ended: answer the request once all its samples have."""
        self.out[req][sample] = generation
        self.left[req] -= 1
        if self.left[req] == 0:
            self.done(req, self.out[req])


def fits(flags: Flags, p: Any) -> bool:
    """Whether a request with sampling params `p` can join a call whose graphs were captured for `flags`."""
    need = Flags.of([p])
    return (
        (flags.top_k_top_p or not need.top_k_top_p)
        and (flags.min_p or not need.min_p)
        and (flags.penalty or not need.penalty)
        and (flags.restricted or not need.restricted)
        and (need.all_greedy or not flags.all_greedy)
    )
