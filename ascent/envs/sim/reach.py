"""Reach: a tiny gymnasium task whose state maps plainly to the right action, for learning tests and demos on
a CPU, in state and in pixels.

A point and a target on a line of `size` cells. The state is one number, the target's offset from the
point (-2 means two cells to the left); the action is Discrete(2): 0 steps left, 1 steps right. Reaching
the target ends the episode with reward 1 (success under `success_rule="goal"`); every other step gives 0.
The start (an offset of 1 or 2, either side) comes from the reset's seed. The best policy moves toward the
sign of the offset and always succeeds; a random one succeeds in about half its episodes within 3 steps,
so "better than random" is a visible margin (CartPole's first skill is the action format, and after it a
random valid policy already survives: a poor probe of learning, `tests/unit/envs/sim/test_learns.py`).

Frames (`render_mode="rgb_array"`) draw the line as `size` squares of `cell` pixels: the point red, the
target green, the rest grey; with `image_obs` and `pixels_only` rows (`ascent.envs.sim.gym_env`) the frame is
the whole observation, a pixel task for a vision-language or VLA policy.

`ReachContinuous` (`ReachContinuous-v0`, `CONTINUOUS_ID`) is the same line for an action head
(`model.action_head`): the point moves by the action, a Box(-1, 1) of one dimension; the target sits 1 away
(either side, from the seed). Each step earns the distance it closed (a dense reward: negative for a step
away) and reaching within `TOLERANCE` ends the episode with 1 more (success under `success_rule="goal"`);
4 steps at most. The best policy steps by the offset (clipped to 1) and succeeds at once.

Registered with gymnasium as `Reach-v0` and `ReachContinuous-v0` when this module is imported; rows name it with its module,
`gym_id: "ascent.envs.sim.reach:Reach-v0"`, so gymnasium imports it in whichever process makes it (a host).
gymnasium is imported at the top here: this module is loaded only by gymnasium itself.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

GYM_ID = "ascent.envs.sim.reach:Reach-v0"
CONTINUOUS_ID = "ascent.envs.sim.reach:ReachContinuous-v0"
TOLERANCE = 0.25  # ReachContinuous: how close counts as reached
COLOURS = {"empty": (90, 90, 90), "point": (220, 40, 40), "target": (40, 200, 60)}


class Reach(gym.Env[np.ndarray, np.int64]):
    """The point-and-target line (module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, size: int = 7, cell: int = 32, render_mode: str | None = None) -> None:
        self.size, self.cell, self.render_mode = size, cell, render_mode
        self.observation_space = gym.spaces.Box(-size, size, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.point, self.target = 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        offset = int(self.np_random.choice([-2, -1, 1, 2]))
        self.point = self.size // 2
        self.target = self.point + offset
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.point = int(np.clip(self.point + (1 if int(action) == 1 else -1), 0, self.size - 1))
        reached = self.point == self.target
        return self._obs(), 1.0 if reached else 0.0, reached, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.target - self.point], dtype=np.float32)

    def render(self) -> Any:
        """An RGB frame [cell, size * cell, 3] uint8: the point red, the target green."""
        frame = np.empty((self.cell, self.size * self.cell, 3), dtype=np.uint8)
        for k in range(self.size):
            what = "point" if k == self.point else "target" if k == self.target else "empty"
            frame[1:-1, k * self.cell + 1 : (k + 1) * self.cell - 1] = COLOURS[what]
            frame[[0, -1], k * self.cell : (k + 1) * self.cell] = 0
        return frame


class ReachContinuous(gym.Env[np.ndarray, np.ndarray]):
    """The line with a continuous step (module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-4.0, 4.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.offset = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.offset = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        before = abs(self.offset)
        move = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        self.offset = float(np.clip(self.offset - move, -4.0, 4.0))
        reached = abs(self.offset) < TOLERANCE
        return self._obs(), before - abs(self.offset) + (1.0 if reached else 0.0), reached, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.offset], dtype=np.float32)

    def render(self) -> Any:
        """An RGB frame [32, 288, 3] uint8: the point red at the centre, the target green at its offset."""
        frame = np.full((32, 288, 3), COLOURS["empty"], dtype=np.uint8)
        frame[:, 140:148] = COLOURS["point"]
        x = int(144 + self.offset * 32)
        frame[:, max(0, x - 4) : min(288, x + 4)] = COLOURS["target"]
        return frame


if "ReachContinuous-v0" not in gym.registry:
    gym.register("ReachContinuous-v0", entry_point=f"{__name__}:ReachContinuous", max_episode_steps=4)
if "Reach-v0" not in gym.registry:
    gym.register("Reach-v0", entry_point=f"{__name__}:Reach", max_episode_steps=3)
