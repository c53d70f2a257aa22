"""Which prompts each iteration uses: deterministic epoch-wise shuffling that resumes exactly.

The orchestrator asks for `prompts_per_step` item indices per iteration. Epoch `e` visits every item once in
the order of a permutation drawn from a NumPy generator seeded by `seed + e`, so the order depends only on
(seed, epoch) and a checkpoint needs only (epoch, position) to continue exactly where it stopped. A batch that
runs past the end of an epoch continues into the next one.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class PromptSampler:
    """Endless stream of item indices in [0, num_items), `batch_size` at a time."""

    def __init__(self, num_items: int, batch_size: int, seed: int = 0, shuffle: bool = True):
        if num_items <= 0:
            raise ValueError(
                f"num_items={num_items}: the dataset has no prompts to sample; check the data path."
            )
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size}: ask for at least one prompt per batch.")
        self.num_items = num_items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0  # next index into the current epoch's order
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_items)
        return np.random.default_rng(self.seed + epoch).permutation(self.num_items)

    def next_batch(self) -> list[int]:
        """The next `batch_size` indices; crosses into the next epoch (reshuffled) when this one runs out."""
        batch: list[int] = []
        while len(batch) < self.batch_size:
            if self.position == self.num_items:
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            take = min(self.batch_size - len(batch), self.num_items - self.position)
            batch.extend(int(i) for i in self._order[self.position : self.position + take])
            self.position += take
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_items": self.num_items,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state; the dataset size and seed must match the saved run."""
        for key in ("num_items", "seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]!r} but this sampler has "
                    f"{key}={getattr(self, key)!r}; "
                    "resume with the same dataset and seed, or start a fresh run."
                )
        if not 0 <= state["position"] <= self.num_items:
            raise ValueError(f"sampler state position={state['position']} is outside [0, {self.num_items}].")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._epoch_order(self.epoch)
