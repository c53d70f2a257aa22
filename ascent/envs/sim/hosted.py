"""Vectorised simulators inside the hosts: each host (a process or a Ray actor, `ascent.envs.hosts`) steps a
block of up to `copies` of a batch's simulator episodes together through gymnasium's vector API.

`HostedSimEnvs` is the runner's view of a batch (`reset(rows)`, `step(calls)`, `close()`, like
`HostedEnvs`): pass it to `run_episodes(..., envs=...)`. The batch's episodes are cut into contiguous blocks
of `copies` (a group's episodes side by side), block b on host b mod the hosts' count; a host keeps a
`SimVectorEnvs` per block (made there from the rows: nothing but rows and action words travel) and answers
one command per block and turn, so a turn of N episodes on W hosts is about N / copies commands, not N.

Failures are the hosts': a simulator that raises costs the episodes of its vector environment
(`SimVectorEnvs`); one that kills its process (a segfault, `os._exit`) or hangs past the isolation policy's
timeout costs the episodes of the command in flight, and the host is replaced: its other blocks of the batch
are lost with it (their next step ends them, "lost with its process"). Episodes on the other hosts go on.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from ascent.envs.base import Action, Message, StepResult
from ascent.envs.hosts import LOST, Command, EnvironmentLost, Hosts
from ascent.envs.sim.vector import SimVectorEnvs


def reset_block(
    state: dict[Any, Any], key: Any, rows: list[Mapping[str, Any]]
) -> list[tuple[list[Message], Any] | str]:
    """A host command: a `SimVectorEnvs` of `rows`, kept under `key`; each row's first observation."""
    vec = state[key] = SimVectorEnvs()
    return vec.reset(rows)


def step_block(state: dict[Any, Any], key: Any, calls: list[tuple[int, Action]]) -> list[StepResult | str]:
    """A host command: one vector step of the block under `key` (calls by position in the block)."""
    if key not in state:
        raise EnvironmentLost(LOST)
    vec: SimVectorEnvs = state[key]
    return vec.step(calls)


def drop_blocks(state: dict[Any, Any], batch: Any) -> int:
    """A host command: close and forget the blocks of `batch` -> how many there were."""
    gone = [k for k in state if isinstance(k, tuple) and k[:2] == ("sim", batch)]
    for k in gone:
        state.pop(k).close()
    return len(gone)


class HostedSimEnvs:
    """A batch of simulator episodes (rows with `gym_id`), `copies` per block, blocks on `hosts`."""

    _ids = itertools.count()

    def __init__(self, hosts: Hosts, copies: int) -> None:
        if copies < 1:
            raise ValueError(f"copies={copies}: a host steps at least one simulator copy")
        self.hosts, self.copies = hosts, copies
        self.batch = next(self._ids)  # unique among the batches that share the hosts
        self.sizes: list[int] = []  # episodes per block
        self.detail = "simulators (env gym)"

    def host(self, b: int) -> int:
        return b % self.hosts.num_hosts

    def key(self, b: int) -> tuple[str, int, int]:
        return ("sim", self.batch, b)

    def reset(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[list[Message], Any] | str]:
        blocks = [list(rows[i : i + self.copies]) for i in range(0, len(rows), self.copies)]
        self.sizes = [len(b) for b in blocks]
        commands: list[tuple[int | None, Command]] = [
            (self.host(b), ("reset", reset_block, (self.key(b), block))) for b, block in enumerate(blocks)
        ]
        out: list[tuple[list[Message], Any] | str] = []
        for size, o in zip(self.sizes, self.hosts.run(commands, self.detail), strict=True):
            out += o.value if o.ok else [str(o.error)] * size
        return out

    def step(self, calls: Sequence[tuple[int, Action]]) -> list[StepResult | str]:
        per_block: dict[int, list[tuple[int, Action]]] = {}
        for i, action in calls:
            per_block.setdefault(i // self.copies, []).append((i % self.copies, action))
        order = sorted(per_block)
        commands: list[tuple[int | None, Command]] = [
            (self.host(b), ("step", step_block, (self.key(b), per_block[b]))) for b in order
        ]
        results: dict[int, StepResult | str] = {}
        for b, o in zip(order, self.hosts.run(commands, self.detail), strict=True):
            answers = o.value if o.ok else [str(o.error)] * len(per_block[b])
            for (j, _), answer in zip(per_block[b], answers, strict=True):
                results[b * self.copies + j] = answer
        return [results[i] for i, _ in calls]

    def close(self) -> None:
        used = sorted({self.host(b) for b in range(len(self.sizes))})
        self.hosts.run([(h, ("drop", drop_blocks, (self.batch,))) for h in used])
