"""The rollout engine interface: prompt token ids and sampling parameters in, trajectories' tokens out.

It holds no transformers types, so a fast GPU engine, a reference engine or a remote server can stand
behind it. Engines are looked up by name in `ENGINES` (filled in `ascent.rollout.__init__`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ascent.messages import Generation, GenerationRequest


@runtime_checkable
class RolloutEngine(Protocol):
    """What the orchestrator needs of a sampler.

    - `generate`: for each request, `request.params.n` generations (same order as `requests`). A request with
      a `session_id` continues a multi-turn episode: its `prompt_ids` hold the whole conversation so far.
    - `update_weights`: load new policy weights given as (name, tensor) pairs in Hugging Face naming, in
      buckets; tensors may live on any device.
    - `sleep` / `wake`: free and restore the engine's cache memory so a colocated trainer can use it.
      `sleep(release_weights=True)` may also free the engine's weight copy; the caller then sends a full set
      with `update_weights` before `wake`. Engines with nothing to gain ignore the flag.
    """

    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None: ...

    def sleep(self, release_weights: bool = False) -> None: ...

    def wake(self) -> None: ...
