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

Waiting is bounded and never silent: every call is scheduled at once (so N hanging calls cost about
ceil(N / num_workers) timeouts: pebble starts a call's clock when a worker takes it), a chunk that fails is
re-run one item at a time, all of its items at once (a one-item chunk's failure is already pinned), and
while calls are still out after `notice_s` seconds the log says how many, for what, and for how long.
pebble notices a worker that dies with a non-zero status; one that exits with status 0 (`os._exit(0)`) it
silently replaces and leaves its call waiting for its timeout, so the wait here polls the pool's workers and
fails such a call within about a second ("its process died (exit code 0) while running a reward call").
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

MAX_CHUNK = 64
POLL_S = 0.2  # how often a wait checks the pool's workers for one that exited with status 0
EXIT_GRACE_S = 1.0  # a worker gone this long without pebble failing its call exited with status 0

log = logging.getLogger(__name__)


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
    # user code: sys.exit and KeyboardInterrupt cost the item only
    except BaseException as err:  # noqa: BLE001
        return Outcome(error=f"{type(err).__name__}: {err}")


def apply_chunk(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Outcome]:
    return [apply_one(fn, item) for item in items]


class InlineRunner:
    """`IsolatedRunner`'s interface, run in this process: no isolation, no timeout."""

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        return apply_chunk(fn, items)

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        return apply_chunk(fn, items)

    def close(self) -> None:
        pass


class IsolatedRunner:
    """A pool of `num_workers` processes; each call of `fn` gets `timeout_s` seconds (see the module doc).

    `what` names a call in messages ("reward"), `timeout_field` the knob that sets `timeout_s`
    ("reward.timeout_s"); past `notice_s` seconds a wait logs what it waits for, every `notice_s`."""

    def __init__(
        self,
        num_workers: int,
        timeout_s: float,
        *,
        preload: Sequence[str] = (),
        what: str = "call",
        timeout_field: str = "timeout_s",
        notice_s: float = 5.0,
    ) -> None:
        self.num_workers, self.timeout_s, self.preload, self.what = num_workers, timeout_s, preload, what
        self.timeout_field, self.notice_s = timeout_field, notice_s
        self.a_call = "a call" if what == "call" else f"a {what} call"  # for messages
        self._pool: Any = None
        self._workers: dict[int, Any] = {}  # pid -> process: every worker seen, for its exit status

    def _get_pool(self) -> Any:
        if self._pool is None:
            import pebble  # deferred on purpose: only runs with isolated user code need it

            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(self.preload))
            self._pool = pebble.ProcessPool(max_workers=self.num_workers, context=ctx)
        return self._pool

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        """One Outcome per item, in order. `detail` says what the calls run, for the wait's log lines
        ("reward.fn=mypkg:score")."""
        if not items:
            return []
        pool = self._get_pool()
        size = max(1, min(MAX_CHUNK, -(-len(items) // (self.num_workers * 4))))
        chunks = [list(items[i : i + size]) for i in range(0, len(items), size)]
        futures = [pool.schedule(apply_chunk, args=(fn, c), timeout=self.timeout_s) for c in chunks]
        self._wait(futures, len(items), detail)
        out: list[list[Outcome] | None] = []
        retry: list[Any] = []  # items of failed chunks of several: find the culprits one item at a time
        for chunk, future in zip(chunks, futures, strict=True):
            if future.exception() is None:
                out.append(future.result())
            elif len(chunk) == 1:
                out.append([self._result(future)])
            else:
                out.append(None)
                retry += chunk
        again = iter(self._one_by_one(fn, retry, detail))
        return [
            o for done, chunk in zip(out, chunks, strict=True) for o in done or [next(again) for _ in chunk]
        ]

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        """One task per item, never run twice (for calls with side effects, e.g. an agent's episodes): an
        item that fails, hangs or kills its process gets that error; the others are unaffected."""
        return self._one_by_one(fn, list(items), detail)

    def _one_by_one(self, fn: Callable[[Any], Any], items: list[Any], detail: str = "") -> list[Outcome]:
        if not items:
            return []
        pool = self._get_pool()
        futures = [pool.schedule(apply_one, args=(fn, item), timeout=self.timeout_s) for item in items]
        self._wait(futures, len(items), detail)
        return [self._result(f) for f in futures]

    def _wait(self, futures: list[Any], calls: int, detail: str) -> None:
        """Until every future is done: fail the calls of workers that exited with status 0, and past
        `notice_s` log what is still out, every `notice_s`."""
        t0 = time.monotonic()
        next_notice = t0 + self.notice_s
        gone: dict[int, float] = {}  # pebble task id -> when its worker was first seen gone
        pending = [f for f in futures if not f.done()]
        while pending:
            wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            self._fail_exited(gone)
            pending = [f for f in pending if not f.done()]
            now = time.monotonic()
            if pending and now >= next_notice:
                next_notice = now + self.notice_s
                about = f" ({detail})" if detail else ""
                log.warning(
                    "waiting for %d of %d %s calls%s, %.0f s so far; each may take %s=%g s",
                    len(pending),
                    calls,
                    self.what,
                    about,
                    now - t0,
                    self.timeout_field,
                    self.timeout_s,
                )

    def _fail_exited(self, gone: dict[int, float]) -> None:
        """Fail each running call whose worker is gone but that pebble left waiting (status 0).

        Reads pebble's pool manager (pebble>=5.1: `task_manager.tasks`, `worker_manager.workers`); pebble
        fails the call of a worker that died with any other status itself, in the step that notices it."""
        from pebble.common import ProcessExpired, Result, ResultStatus  # deferred: see _get_pool

        try:
            manager = self._pool._pool_manager
            alive, tasks = dict(manager.worker_manager.workers), list(manager.task_manager.tasks.values())
        except AttributeError:  # another pebble: its own detection (non-zero statuses) and timeouts remain
            return
        self._workers.update(alive)
        now = time.monotonic()
        for task in tasks:
            pid = task.worker_id
            if not pid or pid in alive or task.future.done():
                gone.pop(task.id, None)
                continue
            if now - gone.setdefault(task.id, now) < EXIT_GRACE_S:
                continue
            proc = self._workers.get(pid)
            code = proc.exitcode if proc is not None and proc.exitcode is not None else 0  # else pebble's
            log.warning("worker %d exited with status %d while running %s; replaced", pid, code, self.a_call)
            error = ProcessExpired(f"worker {pid} exited with status {code}", code, pid)
            manager.task_manager.task_done(task.id, Result(ResultStatus.ERROR, error))
        running = {t.worker_id for t in tasks}  # keep only the workers still of use for an exit status
        self._workers = {pid: p for pid, p in self._workers.items() if pid in alive or pid in running}

    def _result(self, future: Any) -> Outcome:
        import pebble  # deferred: see _get_pool

        try:
            outcome: Outcome = future.result()
            return outcome
        except FutureTimeout:
            return Outcome(
                error=f"timed out after {self.timeout_s:g} s ({self.timeout_field}; its process was killed)"
            )
        except pebble.ProcessExpired as err:
            return Outcome(error=f"its process died ({_exit_text(err.exitcode)}) while running {self.a_call}")
        except Exception as err:  # e.g. a value that does not pickle
            return Outcome(error=f"{type(err).__name__}: {err}")

    def close(self) -> None:
        """Stop the workers (killing any still running); the runner can be used again afterwards."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None
            self._workers = {}


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
