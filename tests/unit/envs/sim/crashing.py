"""A simulator that kills its process, for the hosted vector tests: gymnasium imports this module by the row's
`gym_id` ("tests.unit.envs.sim.crashing:Crash-v0") in the host that makes it."""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np

CRASH_SEED = 13  # the copy reset with this seed kills its process (os._exit(3)) at its first step


class Crash(gym.Env[np.ndarray, int]):
    """A one-number state that counts steps; the copy seeded CRASH_SEED exits its process when stepped."""

    observation_space = gym.spaces.Box(0, 100, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.crashes, self.n = seed == CRASH_SEED, 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action: Any) -> Any:
        if self.crashes:
            os._exit(3)
        self.n += 1
        return np.array([float(self.n)], dtype=np.float32), 1.0, False, False, {}


if "Crash-v0" not in gym.registry:
    gym.register("Crash-v0", entry_point=Crash, max_episode_steps=5)
