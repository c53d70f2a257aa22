"""Weight swaps between decode steps: how a publication from another thread meets a running `generate`.

The fast engine's weights have two users: the decode loop (`generate`, `generate_live`) and a publisher
(`FastEngine.publication`, `update_weights`), which on a Ray replica runs on the actor's second thread while a
long generate call is in progress (`WorkerGroup.call_alongside_async`). `SwapGate` hands the weights from one
to the other, never in the middle of a step:

- the loop holds the gate for the whole call and offers it at every decode-step boundary (`boundary`): when
  a publisher waits, the loop lets go, the publisher copies every weight in place, and the loop goes on with
  the new weights;
- a publisher (`acquire` ... `release`) waits for the loop's next boundary, or for no call to be running;
  publishers that wait go first when a new call starts (`enter`);
- both are reentrant for the thread that holds the gate: a loop callback (`more`, `done`) that publishes is at
  a boundary already, and `update_weights` inside a `publication` takes the gate it holds.

What in-flight sequences do after a swap is the engine's `on_swap` (`continue`: their K/V so far stays and
they go on with the new weights, as PipelineRL and AReaL do; `restart`: they start over); every token
records the version that sampled it either way. A publication that fails partway leaves the weights marked
broken (`WeightSwaps.check`): no call generates from half-copied weights until one completes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch


class SwapGate:
    """Mutual exclusion between the decode loop and weight publishers, handed over at step boundaries."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder: int | None = None  # thread ident of the loop or publisher holding the weights
        self._depth = 0  # reentrant holds of `_holder`
        self._waiting = 0  # publishers waiting for the weights

    def enter(self) -> None:
        """The loop starts a call: take the gate, after any publisher already waiting for it."""
        self._take(lambda: self._holder is None and self._waiting == 0)

    def acquire(self) -> None:
        """A publisher takes the gate: at the loop's next step boundary, or at once when no call runs."""
        if self._reenter():
            return
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: self._holder is None)
            finally:
                self._waiting -= 1
            self._holder, self._depth = threading.get_ident(), 1

    def release(self) -> None:
        """Give the gate back (the loop's `exit` or a publisher's end)."""
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._holder = None
                self._cond.notify_all()

    exit = release

    def boundary(self) -> bool:
        """Called by the loop between two decode steps: lets waiting publishers swap the weights; -> whether
        any did (the loop then carries on with the new weights)."""
        if not self._waiting:  # a racy read: a publisher arriving now is served at the next boundary
            return False
        with self._cond:
            depth, self._holder, self._depth = self._depth, None, 0
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._holder is None and self._waiting == 0)
            self._holder, self._depth = threading.get_ident(), depth
        return True

    @property
    def waiting(self) -> int:
        """Publishers waiting for the loop's next boundary."""
        return self._waiting

    def _reenter(self) -> bool:
        with self._cond:
            if self._holder == threading.get_ident():
                self._depth += 1
                return True
        return False

    def _take(self, ready: Callable[[], bool]) -> None:
        if self._reenter():
            return
        with self._cond:
            self._cond.wait_for(ready)
            self._holder, self._depth = threading.get_ident(), 1


class WeightSwaps:
    """The engine's side of publications: the gate, the policy version of the weights, and how many
    publications there were (`epoch`: a sequence admitted in an older one saw a swap)."""

    def __init__(
        self, device: torch.device, on_publish: Callable[[], None], writes: Callable[[], int] | None = None
    ) -> None:
        self.device = device
        self.on_publish = on_publish  # after every publication (drop sessions)
        self.writes = writes  # tensors copied into the weights so far (None: count any failure as partway)
        self.gate = SwapGate()
        self.version: int | None = None  # policy version of the weights, once a publication names one
        self.epoch = 0
        self.broken: str | None = None  # why the weights are unusable: a publication failed partway
        self._loop_stream: Any = None  # the CUDA stream the running call decodes on

    @contextlib.contextmanager
    def publication(self, version: int | None) -> Iterator[None]:
        """Hold the weights for one publication (see `FastEngine.publication`). If its block raises once a
        weight was copied, the weights may be half-copied: they are marked `broken` (the running call fails at
        its next step boundary, later calls at their start) until a publication completes; the publisher
        gets its error either way."""
        held = copying = False
        before: int | None = None
        cuda, loop = self.device.type == "cuda", None
        try:
            self.gate.acquire()
            held, loop = True, self._loop_stream  # (read once held: a call may start while this waits)
            if cuda and loop is not None:  # the copies are ordered after the steps the loop launched ...
                torch.cuda.current_stream(self.device).wait_stream(loop)
            # a publisher's thread (a Ray actor's second one) starts on device 0: make it the engine's
            with torch.cuda.device(self.device) if cuda else contextlib.nullcontext():
                copying, before = True, self._copied()
                yield
            if version is not None:
                self.version = version
            self.broken = None
        except BaseException as err:
            if copying and (before is None or self._copied() != before):  # (none copied: nothing changed)
                named = "unversioned" if version is None else f"version {version}"
                self.broken = (
                    f"the weight publication ({named}) failed partway ({type(err).__name__}: {err}), "
                    "so the engine's weights may be half-copied; publish the full weights again."
                )
            raise
        finally:
            try:
                if copying:
                    self.epoch += 1
                    self.on_publish()
                    if cuda and loop is not None:  # ... and the loop's next steps after the copies
                        loop.wait_stream(torch.cuda.current_stream(self.device))
            finally:
                if held:
                    self.gate.release()

    def _copied(self) -> int | None:
        return None if self.writes is None else self.writes()

    def check(self) -> None:
        """Raise if a publication failed partway since the last complete one (the decode loop's guard)."""
        if self.broken is not None:
            raise RuntimeError(f"rollout engine: {self.broken}")

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """A generate call holds the weights from start to end, offering them at every step boundary."""
        self.gate.enter()
        if self.device.type == "cuda":
            self._loop_stream = torch.cuda.current_stream(self.device)
        try:
            yield
        finally:
            self._loop_stream = None
            self.gate.exit()
