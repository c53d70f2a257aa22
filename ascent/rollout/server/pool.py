"""`FrontendPool`: the HTTP front-end processes of `--api-processes N`, kept running
(`ascent.rollout.server`).

Every front-end process (`frontend.py`) listens on the server's port with its own SO_REUSEPORT socket, and
the kernel spreads new connections evenly over them (one socket shared by all would let whichever process
wakes first accept a whole burst, and keep-alive connections would then pin the load on it). The engine's
process holds the port with a bound socket that does not listen. A front end that dies loses only its own
connections; while it restarts, new ones go to the others. The pool starts the processes (`spawn`: no
inherited threads or CUDA state) and waits until each listens and has connected to the `EngineHub`; a
supervisor thread restarts one that
dies, logging its exit code, unless front ends keep dying (`MAX_DEATHS` within `DEATH_WINDOW_S`): then it
stops them all, closes the port and keeps the reason in `failure`, which `OpenAIServer.run` raises.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import threading
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any

from ascent.errors import AscentError
from ascent.rollout.server.frontend import FrontendSpec, run_frontend
from ascent.rollout.server.hub import EngineHub

logger = logging.getLogger(__name__)

MAX_DEATHS = 5
DEATH_WINDOW_S = 60.0


class FrontendError(AscentError):
    """The front-end processes could not be started or kept running; the message says why (the processes'
    own errors are above it, on stderr). `ascent serve` prints it and exits 1."""

    exit_code = 1


class FrontendPool:
    """See the module docstring. `start()` returns once all `count` processes serve."""

    def __init__(
        self,
        hub: EngineHub,
        sock: socket.socket,
        spec: FrontendSpec,
        count: int,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.hub, self.sock, self.spec, self.count = hub, sock, spec, count
        self.start_timeout_s = start_timeout_s
        self.procs: list[Any] = []
        self.restarts = 0
        self.failure: str | None = None
        self._ctx = multiprocessing.get_context("spawn")
        self._deaths: deque[float] = deque()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        self.procs = [self._spawn(i) for i in range(self.count)]
        pids = {p.pid for p in self.procs}
        if not self.hub.wait_connected(
            pids, self.start_timeout_s, lambda: all(p.is_alive() for p in self.procs)
        ):
            dead = [f"{p.name} (exit code {p.exitcode})" for p in self.procs if not p.is_alive()]
            self.stop()
            why = (
                f"{', '.join(dead)} died; its error is above"
                if dead
                else (f"not all connected to the engine within {self.start_timeout_s:g} s")
            )
            raise FrontendError(
                f"--api-processes {self.count}: the front-end processes did not start: {why}."
            )
        self._watcher = threading.Thread(target=self._watch, name="ascent-api-watch", daemon=True)
        self._watcher.start()

    def _spawn(self, i: int) -> Any:
        proc = self._ctx.Process(target=run_frontend, args=(self.spec,), name=f"ascent-api-{i}", daemon=True)
        proc.start()
        return proc

    def wait(self) -> None:
        """Block until the pool stops; raise FrontendError if it gave up on its processes."""
        while not self._stopping.wait(0.5):
            pass
        if self.failure is not None:
            raise FrontendError(self.failure)

    # ---- the supervisor ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
            for sentinel in wait(list(sentinels), timeout=0.5):
                if self._stopping.is_set():
                    return
                self._replace(sentinels[sentinel])  # type: ignore[index]

    def _replace(self, i: int) -> None:
        dead = self.procs[i]
        dead.join()
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > DEATH_WINDOW_S:
            self._deaths.popleft()
        if len(self._deaths) >= MAX_DEATHS:
            self.failure = (
                f"--api-processes {self.count}: {len(self._deaths)} front-end processes died within "
                f"{DEATH_WINDOW_S:g} s (the last, {dead.name}, with exit code {dead.exitcode}); their errors "
                "are above. Serving stopped; fix the cause, or serve from one process with --api-processes 1."
            )
            logger.error("%s", self.failure)
            self.stop()
            return
        logger.warning(
            "front-end process %s (pid %s) died with exit code %s; starting another",
            dead.name,
            dead.pid,
            dead.exitcode,
        )
        with self._lock:
            self.procs[i] = self._spawn(i)
        self.restarts += 1

    # ---- stopping ----------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every front end (uvicorn finishes their requests), kill those still there after
        `timeout_s`."""
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout_s)
        with self._lock:
            procs = list(self.procs)
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                logger.warning("front-end process %s did not stop within %g s; killing it", p.name, timeout_s)
                p.kill()
                p.join(5)
        self.sock.close()
