"""Action tokenizers: a simulator's action space as words a language model can emit, and back.

A continuous (Box) action of d dimensions is d words, one per dimension, each naming one of `bins` equal bins
between the dimension's bounds (default 256, as OpenVLA); a bin decodes to its centre, so a round trip moves
an action by at most half a bin. A discrete action (Discrete(n)) is one word naming its index. The words are
`<a0>`, `<a1>`, ... (`ActionTokenizer.words`): give them to `ascent.models.tiny.make_tiny_checkpoint(words=...)`
(or add them to a real tokenizer) so each is one token, or let a character tokenizer spell them.

`parse(text)` reads the first `size` action words of a model turn and returns the action, or None when the
turn has fewer, or a word names a bin past the last: the caller decides what an unparseable turn costs
(`ascent.envs.sim.gym_env`: it ends the episode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ascent.envs.base import Action

WORD = re.compile(r"<a(\d+)>")
DEFAULT_BINS = 256


@dataclass(frozen=True)
class ActionTokenizer:
    """Words for the actions of one space. `discrete`: a Discrete(n) space (`bins` = n, one word); else a Box
    with bounds `low`/`high` [size] (finite), each dimension one word among `bins`."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    bins: int
    discrete: bool = False

    @classmethod
    def for_space(cls, space: Any, bins: int = DEFAULT_BINS) -> ActionTokenizer:
        """The tokenizer of a gymnasium space: Discrete(n) -> n words; Box -> `bins` words per dimension."""
        if hasattr(space, "n"):  # Discrete
            return cls(low=(0.0,), high=(float(space.n - 1),), bins=int(space.n), discrete=True)
        low, high = np.asarray(space.low, dtype=float).ravel(), np.asarray(space.high, dtype=float).ravel()
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError(
                f"action space {space} has an infinite bound; bins need finite bounds (wrap the environment "
                "with gymnasium.wrappers.ClipAction or a bounded space)"
            )
        if bins < 2:
            raise ValueError(f"bins={bins}: a continuous dimension needs 2 bins or more (OpenVLA uses 256)")
        return cls(low=tuple(low.tolist()), high=tuple(high.tolist()), bins=int(bins))

    @property
    def size(self) -> int:
        """Words per action: 1 for a discrete space, the dimensions of a Box."""
        return len(self.low)

    @property
    def words(self) -> list[str]:
        """Every action word, `<a0>` to `<a{bins-1}>`."""
        return [f"<a{k}>" for k in range(self.bins)]

    def bin_of(self, action: Any) -> list[int]:
        """action [size] (or a discrete index) -> its bin per dimension (values past a bound go to its bin)."""
        if self.discrete:
            return [int(np.clip(int(np.asarray(action).reshape(())), 0, self.bins - 1))]
        a = np.asarray(action, dtype=float).reshape(self.size)
        low, high = np.asarray(self.low), np.asarray(self.high)
        k = np.floor((a - low) / (high - low) * self.bins).astype(int)
        return np.clip(k, 0, self.bins - 1).tolist()

    def centre(self, bins: list[int]) -> Any:
        """bins [size] -> the action: a discrete index, or the bins' centres as a float32 array [size]."""
        if self.discrete:
            return int(bins[0])
        low, high = np.asarray(self.low), np.asarray(self.high)
        return (low + (np.asarray(bins) + 0.5) * (high - low) / self.bins).astype(np.float32)

    def encode(self, action: Any) -> str:
        """An action as the words a model would emit for it."""
        return "".join(f"<a{k}>" for k in self.bin_of(action))

    def parse(self, text: str) -> Any | None:
        """The action of a model turn (its first `size` words), or None when it has none that fit."""
        found = [int(k) for k in WORD.findall(text)[: self.size]]
        if len(found) < self.size or any(k >= self.bins for k in found):
            return None
        return self.centre(found)

    def random_text(self, rng: np.random.Generator) -> str:
        """A uniformly random action's words (a random policy, for `ascent debug env --random-actions`)."""
        return "".join(f"<a{k}>" for k in rng.integers(0, self.bins, size=self.size))


def parse_chunk(tokens: ActionTokenizer, action: Action) -> list[Any] | None:
    """A turn's action as the simulator steps to take in order: action words (text) are one step; an action
    head's chunk [chunk][dims] is `chunk` steps, each clipped to the Box's bounds. None when it does not fit
    (no action words; a chunk for a discrete space, or of other dimensions than the space's)."""
    if isinstance(action, str):
        parsed = tokens.parse(action)
        return None if parsed is None else [parsed]
    steps = np.asarray(action, dtype=np.float32)
    if tokens.discrete or steps.ndim != 2 or steps.shape[1] != tokens.size or len(steps) == 0:
        return None
    return list(np.clip(steps, np.asarray(tokens.low), np.asarray(tokens.high)).astype(np.float32))
