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


def fits(flags: Flags, p: Any) -> bool:
    """Whether a request with sampling params `p` can join a call whose graphs were captured for `flags`."""
    need = Flags.of([p])
    return ((flags.top_k_top_p or not need.top_k_top_p) and (flags.min_p or not need.min_p)
            and (flags.penalty or not need.penalty) and (need.all_greedy or not flags.all_greedy))  # fmt: skip
