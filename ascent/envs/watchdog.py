"""A watchdog for agents that block their own event loop (`ascent.envs.openai_agents`; design: "One mechanism
runs user code in isolation ... with one timeout").

An agent's episodes run concurrently on one asyncio loop, each bounded by `asyncio.wait_for`. A timeout on
the loop cannot fire while the loop is blocked: an async agent that calls `time.sleep(1000)` (or computes
for minutes without awaiting) would hold every episode of its process until the process itself is killed.
`LoopWatchdog` is a thread beside the loop: the loop beats every `BEAT_S`; when the beat is stale and an
episode is past its deadline by `GRACE_S`, the loop is blocked by user code, and the watchdog interrupts the
main thread with a signal whose handler raises `AgentBlockedError` in the frame that blocks (a
`BaseException`, so an agent's `except Exception` does not swallow it). The episode that blocked fails,
the loop goes on, and the overdue episodes time out as usual. Code that never returns to the interpreter (a
long call into C that retries on signals) is left to the agent process's own kill.

Signals reach Python handlers only on the main thread, so the watchdog runs where `play` runs there (the
agent processes); elsewhere (`rollout.env_isolation=inline` called from another thread) it stays off.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from types import FrameType, TracebackType

BEAT_S = 0.1  # how often the loop says it is alive
GRACE_S = 1.0  # how long past an episode's deadline a blocked loop is tolerated
_SIGNAL = signal.SIGUSR2
_LOOP_FILES = ("/asyncio/", "selectors.py")  # a signal landing in the loop's own code waits for the next try


class AgentBlockedError(BaseException):
    """Raised in an agent's frame that blocked the event loop past its episode's deadline."""


class LoopWatchdog:
    """Use `with LoopWatchdog(timeout_s) as dog:` around `asyncio.run`; in the loop, `await dog.beat()` in
    a task and `dog.opened(key)` / `dog.closed(key)` around each episode (see the module doc)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadlines: dict[object, float] = {}
        self.last_beat = time.monotonic()
        self._firing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: object = None
        self._main = threading.main_thread().ident

    @property
    def active(self) -> bool:
        return self._thread is not None

    def __enter__(self) -> LoopWatchdog:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(_SIGNAL, self._interrupt)
            self._thread = threading.Thread(target=self._watch, name="ascent-agent-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            signal.signal(_SIGNAL, self._previous)  # type: ignore[arg-type]

    def opened(self, key: object) -> None:
        self.deadlines[key] = time.monotonic() + self.timeout_s

    def closed(self, key: object) -> None:
        self.deadlines.pop(key, None)

    async def beat(self) -> None:
        """Runs until cancelled: marks the loop alive every `BEAT_S`."""
        while True:
            self.last_beat = time.monotonic()
            await asyncio.sleep(BEAT_S)

    def _blocked(self, now: float) -> bool:
        overdue = any(now > d + GRACE_S for d in list(self.deadlines.values()))
        return overdue and now - self.last_beat > GRACE_S

    def _watch(self) -> None:
        while not self._stop.wait(BEAT_S):
            if self._blocked(time.monotonic()) and self._main is not None:
                self._firing = True
                signal.pthread_kill(self._main, _SIGNAL)
                self._stop.wait(GRACE_S)  # let the loop recover before judging again

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        if not self._firing or not self._blocked(time.monotonic()):
            return
        if frame is not None and any(part in frame.f_code.co_filename for part in _LOOP_FILES):
            return
        self._firing = False
        raise AgentBlockedError(
            f"the agent blocked its event loop past rollout.source.timeout_s={self.timeout_s:g} s (a "
            "blocking call in async code, e.g. time.sleep or a long computation: await asyncio.sleep, or run "
            "it with asyncio.to_thread)"
        )
