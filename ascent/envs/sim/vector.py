"""Vectorised stepping: the episodes of a batch that share a simulator step together through gymnasium's
vector API (`SyncVectorEnv`, one call for N copies).

`SimVectorEnvs` is a drop-in for the runner's view of a batch's environments (`reset(rows)`, `step(calls)`,
`close()`, like `ascent.envs.hosts.HostedEnvs`): pass it to `run_episodes(..., envs=...)`. Rows that
share their simulator spec (everything but `seed`) form one vector environment, reset with each row's seed.
A step call steps every vector environment once: episodes that are not stepped this turn (ended, or their
turn had no action) get a placeholder action whose result is dropped; a copy whose simulator finished is
reset at once (autoreset off, `reset_mask`) so the vector can step again, and its episode is never stepped on.
A turn without a parseable action ends its episode as in `GymEnv`. An action head's turn is a chunk of
continuous vectors (`parse_chunk`): its steps run in order (`step_chunks`), the turn's reward their sum. A simulator that raises costs the episodes
of its vector environment (their result is the error's text, as the runner expects), never the batch; a
simulator that crashes its process is the hosts' business (`ascent.envs.hosts`).

Inside hosts: `ascent.envs.sim.hosted.HostedSimEnvs` keeps one `SimVectorEnvs` per block of a batch in each
host process or Ray actor and steps it with one command per block and turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ascent.envs.base import Action, Message, StepResult
from ascent.envs.sim.actions import ActionTokenizer, parse_chunk
from ascent.envs.sim.gym_env import SimEpisode, SimSpec


class _Block:
    """The episodes (batch indices) of one spec, in one SyncVectorEnv."""

    def __init__(self, spec: SimSpec, members: list[int], seeds: list[int]) -> None:
        from gymnasium.vector import AutoresetMode, SyncVectorEnv  # deferred: the `sim` extra

        self.members = members
        self.vec = SyncVectorEnv([spec.make] * len(members), autoreset_mode=AutoresetMode.DISABLED)
        self.actions = ActionTokenizer.for_space(self.vec.single_action_space, spec.bins)
        self.episodes = [SimEpisode(replace(spec, seed=s), self.actions) for s in seeds]
        self.obs, _ = self.vec.reset(seed=list[int | None](seeds))
        self.placeholder = self.actions.centre([0] * self.actions.size)

    def frames(self) -> list[Any]:
        if not self.episodes[0].spec.render:
            return [None] * len(self.members)
        return list(self.vec.render())

    def step(self, actions: dict[int, Any]) -> dict[int, StepResult]:
        """actions: position in the block -> parsed action; -> the stepped positions' results."""
        batch = np.stack([np.asarray(actions.get(j, self.placeholder)) for j in range(len(self.members))])
        self.obs, rewards, terminated, truncated, _ = self.vec.step(batch)
        frames = self.frames()
        ended = np.logical_or(terminated, truncated)
        if ended.any():  # autoreset is off: a finished copy must be reset before the next vector step
            self.vec.reset(options={"reset_mask": ended})
        return {
            j: self.episodes[j].outcome(
                self.obs[j], float(rewards[j]), terminated[j], truncated[j], frames[j]
            )
            for j in actions
        }


def step_chunks(block: _Block, chunks: dict[int, list[Any]]) -> dict[int, StepResult]:
    """Step a block's episodes through their chunks (position -> steps), one vector step per chunk step; an
    episode that ends mid-chunk drops the rest. Each episode's result is its last step's, with the reward
    summed over its steps and `info["step_rewards"]` listing them (a one-step chunk: unchanged)."""
    results: dict[int, list[StepResult]] = {j: [] for j in chunks}
    for k in range(max(len(c) for c in chunks.values())):
        now = {j: c[k] for j, c in chunks.items() if k < len(c) and not (results[j] and results[j][-1].done)}
        if not now:
            break
        for j, result in block.step(now).items():
            results[j].append(result)
    out = {}
    for j, steps in results.items():
        if len(steps) == 1:
            out[j] = steps[0]
            continue
        rewards = [r.reward for r in steps]
        out[j] = replace(steps[-1], reward=sum(rewards), info=steps[-1].info | {"step_rewards": rewards})
    return out


class SimVectorEnvs:
    """A batch of simulator episodes (rows with `gym_id`), stepped through vector environments."""

    def __init__(self) -> None:
        self.blocks: list[_Block] = []
        self.where: dict[int, tuple[int, int]] = {}  # batch index -> (block, position)

    def reset(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[list[Message], Any] | str]:
        out: list[tuple[list[Message], Any] | str] = ["not reset"] * len(rows)
        specs: dict[SimSpec, list[int]] = {}
        for i, row in enumerate(rows):
            try:
                specs.setdefault(replace(SimSpec.from_row(row), seed=0), []).append(i)
            except Exception as e:  # a malformed row: its reset fails, the others go on
                out[i] = f"{type(e).__name__}: {e}"
        for spec, members in specs.items():
            try:
                block = _Block(spec, members, [int(rows[i].get("seed", 0)) for i in members])
            except Exception as e:  # noqa: BLE001 - the simulator: costs its episodes
                for i in members:
                    out[i] = f"{type(e).__name__}: {e}"
                continue
            self.blocks.append(block)
            for j, (i, frame) in enumerate(zip(members, block.frames(), strict=True)):
                self.where[i] = (len(self.blocks) - 1, j)
                out[i] = (block.episodes[j].first(block.obs[j], frame), None)
        return out

    def step(self, calls: Sequence[tuple[int, Action]]) -> list[StepResult | str]:
        results: dict[int, StepResult | str] = {}
        per_block: dict[int, dict[int, list[Any]]] = {}
        for i, action in calls:
            b, j = self.where[i]
            chunk = parse_chunk(self.blocks[b].actions, action)
            if chunk is None:
                results[i] = self.blocks[b].episodes[j].invalid()
            else:
                per_block.setdefault(b, {})[j] = chunk
        for b, chunks in per_block.items():
            block = self.blocks[b]
            try:
                for j, result in step_chunks(block, chunks).items():
                    results[block.members[j]] = result
            except Exception as e:  # noqa: BLE001 - the simulator: costs the episodes it was stepping
                for j in chunks:
                    results[block.members[j]] = f"{type(e).__name__}: {e}"
        return [results[i] for i, _ in calls]

    def frames(self, i: int) -> list[Any]:
        """Episode `i`'s frames so far (rows with `render`)."""
        b, j = self.where[i]
        return self.blocks[b].episodes[j].frames

    def close(self) -> None:
        for block in self.blocks:  # the episodes (and their frames) stay readable
            block.vec.close()
