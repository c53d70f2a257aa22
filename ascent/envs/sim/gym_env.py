"""A gymnasium simulator as an ascent environment: state vectors as text, actions as action words.

The row says everything (environments are made without arguments, so one registered name serves every
task): `gym_id` (any registered gymnasium id: CartPole-v1, Pendulum-v1, InvertedPendulum-v5, ...), `seed`
(the initial state: every episode of a row's group starts from the same one, as GRPO compares them),
`max_steps` (the episode's step limit, else the id's own), `bins` (action words per continuous dimension,
default 256), `decimals` (of the state's text, default 2), `success_rule` and `success_return` (below), `render`
(keep RGB frames in `env.frames`, for `ascent debug env --frames`) and `image_obs` (also send each frame as
an image content part `{"type": "image", "image": <uint8 array [H, W, 3]>}` beside the text) and
`pixels_only` (with `image_obs`: the text leaves the state out, so the frame is the whole observation: a
pixel task, e.g. `ascent.envs.sim.reach`) and `frames_dir` (set by the training loop to `<run_dir>/frames`:
a rendering episode writes each frame there as `<episode>/<step>.png` and lists those paths, relative to
the folder, in `info["frames"]`, which the episode's metadata keeps for the studio's episode browser) and
`instructions` (default true; false: the first message is the state alone, as every later observation is,
without the gym id and the action words: for a tiny policy made from scratch, which cannot read them and
whose attention a long fixed preamble spreads thin, `tests/integration/test_embodied_learns.py`). Frames
render headless through MuJoCo's `MUJOCO_GL` (default here: egl; `ascent doctor` says which works).

An action head's turn (`model.action_head`) is a chunk of continuous vectors for a Box space: its steps run
in order (each clipped to the bounds), the turn's reward is their sum (`info["step_rewards"]` lists them)
and an episode that ends mid-chunk drops the rest. Otherwise each model turn is one simulator step: the turn's first action words (`ascent.envs.sim.actions`) are the
action, the step's reward is the turn's reward, and the episode's reward is the return. A turn without a
parseable action ENDS the episode (reward 0 for that turn, `info["invalid_action"]`): the steps it gives up
are its cost, so a policy learns the action format before anything else.

Success (`info["success"]`, recorded on the episode by the runner; `env/success_rate`): with
`success_return`, a return at or above it; else `success_rule="survive"` (default: the episode reached its step
limit without terminating: CartPole, InvertedPendulum) or `"goal"` (it terminated: MountainCar's flag).
`info["episode_length"]` counts the simulator steps (`env/episode_length`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ascent.envs.base import Action, Message, StepResult
from ascent.envs.sim.actions import DEFAULT_BINS, ActionTokenizer, parse_chunk
from ascent.envs.sim.frames import save_frame

SUCCESS_RULES = ("survive", "goal")
FRAME = 128  # rendered frames' width and height, where the simulator takes them (MuJoCo)


@dataclass(frozen=True)
class SimSpec:
    """What a row asks of the simulator (see the module docstring for each field)."""

    gym_id: str
    seed: int = 0
    max_steps: int | None = None
    bins: int = DEFAULT_BINS
    decimals: int = 2
    success_rule: str = "survive"
    success_return: float | None = None
    render: bool = False
    image_obs: bool = False
    pixels_only: bool = False
    frames_dir: str | None = None
    instructions: bool = True

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SimSpec:
        if "gym_id" not in row:
            raise ValueError(f"the row has no `gym_id` (e.g. 'CartPole-v1'); its fields: {sorted(row)}")
        rule = str(row.get("success_rule", "survive"))
        if rule not in SUCCESS_RULES:
            raise ValueError(
                f"the row's success_rule={rule!r}; choose one of {SUCCESS_RULES} (or set success_return)"
            )
        limit, target = row.get("max_steps"), row.get("success_return")
        return cls(
            gym_id=str(row["gym_id"]),
            seed=int(row.get("seed", 0)),
            max_steps=None if limit is None else int(limit),
            bins=int(row.get("bins", DEFAULT_BINS)),
            decimals=int(row.get("decimals", 2)),
            success_rule=rule,
            success_return=None if target is None else float(target),
            render=any(bool(row.get(k, False)) for k in ("render", "image_obs", "pixels_only")),
            image_obs=bool(row.get("image_obs", False)) or bool(row.get("pixels_only", False)),
            pixels_only=bool(row.get("pixels_only", False)),
            frames_dir=None if row.get("frames_dir") is None else str(row["frames_dir"]),
            instructions=bool(row.get("instructions", True)),
        )

    def make(self) -> Any:
        """A fresh gymnasium environment of this spec (rgb_array rendering when frames are wanted)."""
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless: a GPU's EGL, or Mesa's on a CPU machine
        import gymnasium as gym  # deferred: the `sim` extra, only for simulator environments

        kwargs: dict[str, Any] = {} if self.max_steps is None else {"max_episode_steps": self.max_steps}
        if not self.render:
            return gym.make(self.gym_id, **kwargs)
        try:  # MuJoCo's tasks take a frame size; classic control's draw their own (with pygame)
            return gym.make(self.gym_id, render_mode="rgb_array", width=FRAME, height=FRAME, **kwargs)
        except TypeError:
            return gym.make(self.gym_id, render_mode="rgb_array", **kwargs)


class SimEpisode:
    """One episode's bookkeeping, shared by `GymEnv` and the vectorised `SimVectorEnvs`: the state's text,
    the return, the steps, success, and each step's `StepResult`."""

    def __init__(self, spec: SimSpec, actions: ActionTokenizer) -> None:
        self.spec, self.actions = spec, actions
        self.steps, self.total = 0, 0.0
        self.frames: list[Any] = []  # RGB uint8 [H, W, 3] each, when the spec renders
        self.frame_files: list[str] = []  # under spec.frames_dir, when set
        self.uid = uuid.uuid4().hex[:16]

    def keep(self, frame: Any) -> None:
        """Keep a rendered frame (None: the spec does not render), and write it under `frames_dir`."""
        if frame is None:
            return
        self.frames.append(frame)
        if self.spec.frames_dir is not None:
            name = f"{self.uid}/{len(self.frames) - 1:03d}.png"
            save_frame(frame, Path(self.spec.frames_dir) / name)
            self.frame_files.append(name)

    def state_text(self, obs: Any) -> str:
        if self.spec.pixels_only:
            return "(the image)"
        return " ".join(f"{x:.{self.spec.decimals}f}" for x in np.asarray(obs, dtype=float).ravel())

    def message(self, text: str, frame: Any = None) -> Message:
        if frame is None or not self.spec.image_obs:
            return {"role": "user", "content": text}
        parts = [{"type": "image", "image": frame}, {"type": "text", "text": text}]
        return {"role": "user", "content": parts}  # type: ignore[dict-item]  # image parts (branch vlenv)

    def first(self, obs: Any, frame: Any = None) -> list[Message]:
        self.keep(frame)
        if not self.spec.instructions:
            return [self.message(self.state_text(obs), frame)]
        a = self.actions
        how = (
            f"one of {a.words[0]}..{a.words[-1]}"
            if a.discrete
            else f"{a.size} of {a.words[0]}..{a.words[-1]}"
        )
        intro = f"{self.spec.gym_id}. Each turn answer with an action: {how}. State: {self.state_text(obs)}"
        return [self.message(intro, frame)]

    def invalid(self) -> StepResult:
        return StepResult(done=True, info=self.info(done=True, success=False) | {"invalid_action": True})

    def outcome(
        self, obs: Any, reward: float, terminated: bool, truncated: bool, frame: Any = None
    ) -> StepResult:
        self.steps += 1
        self.total += float(reward)
        done = bool(terminated or truncated)
        self.keep(frame)
        if self.spec.success_return is not None:
            success = done and self.total >= self.spec.success_return
        elif self.spec.success_rule == "goal":
            success = bool(terminated)
        else:
            success = bool(truncated and not terminated)
        info = self.info(done=done, success=success) | {
            "terminated": bool(terminated),
            "truncated": bool(truncated),
        }
        observation = () if done else (self.message(self.state_text(obs), frame),)
        return StepResult(observation=observation, reward=float(reward), done=done, info=info)

    def info(self, *, done: bool, success: bool) -> dict[str, Any]:
        info = {"success": success, "episode_length": self.steps, "return": self.total, "sim_done": done}
        return info | ({"frames": list(self.frame_files)} if self.frame_files else {})


class GymEnv:
    """One simulator episode per `reset(row)` (module docstring: the row's fields, actions, success)."""

    simulator = True  # `ascent doctor` probes MuJoCo's renderer for configs that use one

    def __init__(self) -> None:
        self.env: Any = None
        self.frames: list[Any] = []

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        spec = SimSpec.from_row(row)
        if self.env is not None:
            self.env.close()
        self.env = spec.make()
        self.actions = ActionTokenizer.for_space(self.env.action_space, spec.bins)
        self.episode = SimEpisode(spec, self.actions)
        self.frames = self.episode.frames
        obs, _ = self.env.reset(seed=spec.seed)
        self.env.action_space.seed(spec.seed)
        return self.episode.first(obs, self._frame())

    def step(self, action: Action) -> StepResult:
        chunk = parse_chunk(self.actions, action)  # action words: one step; an action head's chunk: several
        if chunk is None:
            return self.episode.invalid()
        rewards: list[float] = []
        for a in chunk:
            obs, reward, terminated, truncated, _ = self.env.step(a)
            rewards.append(float(reward))
            result = self.episode.outcome(obs, float(reward), terminated, truncated, self._frame())
            if result.done:
                break
        if len(rewards) == 1:
            return result
        return replace(result, reward=sum(rewards), info=result.info | {"step_rewards": rewards})

    def _frame(self) -> Any:
        return self.env.render() if self.episode.spec.render else None

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None
