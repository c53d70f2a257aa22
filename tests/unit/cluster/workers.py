"""Toy worker classes for the worker-group tests (a module, so Ray workers can import them by name)."""

from __future__ import annotations

import os
import threading
import time

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Counter:
    """A counter whose start depends on the rank: rank r starts at `start + 100 * r`."""

    def __init__(self, start: int = 0, *, step: int = 1) -> None:
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.value = start + 100 * self.rank
        self.step = step
        self.flag = threading.Event()

    def get(self) -> int:
        return self.value

    def add(self, n: int | None = None) -> int:
        self.value += self.step if n is None else n
        return self.value

    def add_all(self, numbers: list[int], *, scale: int = 1) -> int:
        self.value += scale * sum(numbers)
        return self.value

    def env(self, *names: str) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in (names or RANK_VARS)}

    def fail(self, message: str) -> None:
        raise ValueError(f"rank {self.rank}: {message}")

    def fail_on_rank(self, rank: int, message: str) -> int:
        if self.rank == rank:
            raise KeyError(message)
        return self.rank

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def wait_for_flag(self, timeout_s: float) -> bool:
        """Block until `set_flag` runs (True) or `timeout_s` passes (False)."""
        return self.flag.wait(timeout_s)

    def set_flag(self) -> int:
        self.flag.set()
        return self.rank

    def crash(self) -> None:
        os._exit(3)

    def _private(self) -> int:
        return self.value


class BrokenInit:
    """A worker whose constructor raises."""

    def __init__(self) -> None:
        raise RuntimeError("no model at /nonexistent")

    def get(self) -> int:
        return 0


class UserErrorInit:
    """A worker whose constructor raises a user error (an AscentError)."""

    def __init__(self, path: str) -> None:
        from ascent.errors import AscentError

        raise AscentError(f"model.path={path!r}: no such directory; point it at a checkpoint.")
