"""The inline backend: the worker lives in the controller's process (one device, fast start, `breakpoint()`).

It runs exactly one worker (rank 0 of a world of 1): several workers in one process cannot each own a
device or a torch.distributed rank, so `num_workers > 1` asks for `backend="ray"`. Calls run at once,
in the caller's thread; a `_async` call has finished by the time it returns and `get()` hands back its
result or raises its error, as the Ray backend would.

The timeout is enforced with SIGALRM when the caller is the main thread of a Unix process (otherwise calls
are not timed). It does not fire while a debugger (pdb, `breakpoint()`) is stopped in the call.
"""

from __future__ import annotations

import bdb
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ascent.cluster.base import PendingCall, W, WorkerGroup, find_free_port, rank_env
from ascent.cluster.errors import ClusterConfigError, WorkerError, WorkerTimeoutError
from ascent.errors import AscentError

_DEBUGGER_RECHECK_S = 10.0


def _debugger_active() -> bool:
    """True while pdb (or another bdb debugger) traces this thread."""
    tracer = sys.gettrace()
    return isinstance(getattr(tracer, "__self__", None), bdb.Bdb)


def _can_alarm() -> bool:
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


@contextmanager
def _deadline(timeout_s: float, make_error: Callable[[], BaseException]) -> Iterator[None]:
    """Raise `make_error()` inside the body if it runs longer than `timeout_s` (see module docstring)."""
    if not _can_alarm() or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield  # not the main thread, or someone else's timer is running: leave it alone
        return

    def on_alarm(signum: int, frame: Any) -> None:
        if _debugger_active():
            signal.setitimer(signal.ITIMER_REAL, _DEBUGGER_RECHECK_S)
            return
        raise make_error()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _DonePending(PendingCall[Any]):
    """An inline call that already ran: its results, or the error to raise on `get()`."""

    def __init__(self, results: list[Any], error: BaseException | None) -> None:
        self._results, self._error = results, error

    def get(self) -> list[Any]:
        if self._error is not None:
            raise self._error
        return self._results

    def forward(self, index: int = 0) -> Any:
        return self.get()[index]

    def others(self, index: int = 0) -> list[Any]:
        return [r for i, r in enumerate(self.get()) if i != index]


class InlineWorkerGroup(WorkerGroup[W]):
    """One worker constructed in this process; methods are plain calls."""

    backend = "inline"

    def __init__(
        self,
        cls: type[W],
        *,
        name: str,
        num_workers: int = 1,
        init_args: Sequence[Any] = (),
        init_kwargs: dict[str, Any] | None = None,
        timeout_s: float = 1800.0,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(cls, name=name, num_workers=num_workers, timeout_s=timeout_s)
        if num_workers != 1:
            raise ClusterConfigError(
                f"worker group '{name}': num_workers={num_workers} with backend=inline; the inline backend "
                "runs one worker in the controller's process. Set cluster.backend=ray to run several workers "
                "(a local Ray cluster works on one machine), or use 1 worker."
            )
        os.environ.update(
            rank_env(
                rank=0,
                world_size=1,
                local_rank=0,
                local_world_size=1,
                master_addr="127.0.0.1",
                master_port=find_free_port(),
                extra=env,
            )
        )
        self._worker: Any = None
        worker, error = self._run(f"{cls.__name__}.__init__", lambda: cls(*init_args, **(init_kwargs or {})))
        if error is not None:
            raise error
        self._worker = worker

    def _run(self, label: str, fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
        """(`fn()`, None) under the timeout, or (None, the wrapped error) when the worker raised."""

        def timeout() -> WorkerTimeoutError:
            return WorkerTimeoutError(self.name, label, self.timeout_s, [0])

        try:
            with _deadline(self.timeout_s, timeout):
                return fn(), None
        except (WorkerTimeoutError, AscentError) as e:  # user errors keep their own type and message
            return None, e
        except Exception as e:
            error = WorkerError(self.name, 0, label, f"{type(e).__name__}: {e}")
            error.__cause__ = e
            return None, error

    def _submit(
        self, method: str, calls: Sequence[tuple[int, tuple, dict]], alongside: bool = False
    ) -> PendingCall[Any]:
        if self._worker is None:
            raise RuntimeError(f"worker group '{self.name}' is shut down; {method} cannot run.")
        results = []
        for _rank, args, kwargs in calls:
            result, error = self._run(
                method, functools.partial(getattr(self._worker, method), *args, **kwargs)
            )
            if error is not None:
                return _DonePending([], error)
            results.append(result)
        return _DonePending(results, None)

    def shutdown(self) -> None:
        self._worker = None

    @property
    def worker(self) -> W:
        """The worker object itself (inline only: handy in tests and in a debugger)."""
        return self._worker
