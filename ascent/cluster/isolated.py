"""Running user code isolated: a pool of worker processes with a per-call timeout (design: "Environments and
tools": untrusted code never runs in the controller's process).

`IsolatedRunner.map(fn, items)` applies `fn` to every item in worker processes and returns one `Outcome` per
item, in order: its value, or why it failed ("ValueError: ...", "timed out after 30 s", "process died
(exit code -9)"). A call that raises, calls `sys.exit`, hangs, or kills its process costs that item only;
the pool replaces a dead or timed-out worker and goes on. Items travel in chunks (one round trip per
chunk); a chunk that times out or loses its process is re-run one item at a time, so the failure is
pinned on exactly the items that cause it. `InlineRunner` has the same interface in-process (no timeout,
`breakpoint()` works): for debugging and for callables that cannot be pickled.

The pool is pebble's `ProcessPool` (kills a task's process on timeout and detects dead workers, which the
standard library's `ProcessPoolExecutor` does not: there one dead worker breaks the whole pool), started
with `forkserver` so a worker never inherits the controller's threads, and with `preload` modules imported
once in the fork server. `fn` and the items must pickle: module-level functions, `functools.partial` of
them, dataclasses. Used for reward functions today; tools and environment steps are the same kind of call.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

MAX_CHUNK = 64


@dataclass(frozen=True)
class Outcome:
    """What one call gave: `value` when `error` is None, else `error` says why it failed."""

    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def apply_one(fn: Callable[[Any], Any], item: Any) -> Outcome:
    """fn(item) as an Outcome; every exception, SystemExit included, becomes an error outcome."""
    try:
        return Outcome(value=fn(item))
    except BaseException as err:  # noqa: BLE001 - user code: sys.exit and KeyboardInterrupt cost the item only
        return Outcome(error=f"{type(err).__name__}: {err}")


def apply_chunk(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Outcome]:
    return [apply_one(fn, item) for item in items]


class InlineRunner:
    """`IsolatedRunner`'s interface, run in this process: no isolation, no timeout."""

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Outcome]:
        return apply_chunk(fn, items)

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Outcome]:
        return apply_chunk(fn, items)

    def close(self) -> None:
        pass


class IsolatedRunner:
    """A pool of `num_workers` processes; each call of `fn` gets `timeout_s` seconds (see the module doc)."""

    def __init__(
        self, num_workers: int, timeout_s: float, *, preload: Sequence[str] = (), what: str = "call"
    ) -> None:
        self.num_workers, self.timeout_s, self.preload, self.what = num_workers, timeout_s, preload, what
        self._pool: Any = None

    def _get_pool(self) -> Any:
        if self._pool is None:
            import pebble

            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(self.preload))
            self._pool = pebble.ProcessPool(max_workers=self.num_workers, context=ctx)
        return self._pool

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Outcome]:
        """One Outcome per item, in order."""
        if not items:
            return []
        pool = self._get_pool()
        size = max(1, min(MAX_CHUNK, -(-len(items) // (self.num_workers * 4))))
        chunks = [list(items[i : i + size]) for i in range(0, len(items), size)]
        futures = [pool.schedule(apply_chunk, args=(fn, c), timeout=self.timeout_s) for c in chunks]
        out: list[Outcome] = []
        for chunk, future in zip(chunks, futures, strict=True):
            try:
                out += future.result()
            except Exception:  # timed out or died as a whole: find the culprits one item at a time
                out += self._one_by_one(fn, chunk)
        return out

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Outcome]:
        """One task per item, never run twice (for calls with side effects, e.g. an agent's episodes): an
        item that fails, hangs or kills its process gets that error; the others are unaffected."""
        return self._one_by_one(fn, list(items))

    def _one_by_one(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Outcome]:
        pool = self._get_pool()
        futures = [pool.schedule(apply_one, args=(fn, item), timeout=self.timeout_s) for item in items]
        return [self._result(f) for f in futures]

    def _result(self, future: Any) -> Outcome:
        import pebble

        try:
            outcome: Outcome = future.result()
            return outcome
        except FutureTimeout:
            return Outcome(error=f"timed out after {self.timeout_s:g} s (its process was killed)")
        except pebble.ProcessExpired as err:
            return Outcome(error=f"its process died ({_exit_text(err.exitcode)})")
        except Exception as err:  # e.g. a value that does not pickle
            return Outcome(error=f"{type(err).__name__}: {err}")

    def close(self) -> None:
        """Stop the workers (killing any still running); the runner can be used again afterwards."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def default_workers(requested: int | None) -> int:
    """`requested`, or min(4, CPUs) when None."""
    return requested if requested else max(1, min(4, os.cpu_count() or 1))
