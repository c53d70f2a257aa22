"""Environments that misbehave (and two that count), for the host tests: importable by name from a host
process or a Ray actor."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ascent.envs import StepResult


class Counter:
    """Keeps state between turns: answers the number of turns so far; done after `row["turns"]`, rewarded with
    that number, + 0.5 when it ran in another process than `row["parent"]`."""

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        self.n, self.limit, self.parent = 0, int(row["turns"]), row.get("parent", os.getpid())
        return [{"role": "user", "content": "count"}]

    def step(self, action: str) -> StepResult:
        self.n += 1
        if self.n >= self.limit:
            return StepResult(reward=float(self.n) + (0.5 if self.parent != os.getpid() else 0.0), done=True)
        return StepResult(({"role": "user", "content": str(self.n)},))


class Hang(Counter):
    def step(self, action: str) -> StepResult:
        time.sleep(3600)
        raise AssertionError("unreachable")


class Crash(Counter):
    def step(self, action: str) -> StepResult:
        os._exit(3)


class Hog(Counter):
    """Allocates 4 GiB at its first step (past the memory limit of the host tests that use it)."""

    def step(self, action: str) -> StepResult:
        self.ballast = bytearray(4 << 30)
        raise AssertionError("a memory limit should have stopped this allocation")


class Exit(Counter):
    def step(self, action: str) -> StepResult:
        sys.exit("leaving")


class Tally(Counter):
    """Done at its first step, rewarded with how many Tally environments its process has made so far: a host
    reused across batches keeps counting, a fresh one starts again at 1."""

    made = 0

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        Tally.made += 1
        self.rank = Tally.made
        return super().reset(row)

    def step(self, action: str) -> StepResult:
        return StepResult(reward=float(self.rank), done=True)


class QuietExit(Counter):
    """Ends its process with status 0 (no exception, no signal: only the process's end tells)."""

    def step(self, action: str) -> StepResult:
        os._exit(0)


class Unsendable(Counter):
    """Answers with something that cannot travel back from its process (a lambda in info)."""

    def step(self, action: str) -> StepResult:
        return StepResult(done=True, info={"f": lambda: 1})


class HangsAtReset(Counter):
    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        time.sleep(600)
        return []
