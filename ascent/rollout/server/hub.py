"""`EngineHub`: the engine process's side of `--api-processes N` (`ascent.rollout.server`).

A thread running its own event loop serves a unix socket (in a fresh 0700 directory: only this user can
connect) that every front-end process (`frontend.py`) connects to once. For each `submit` it queues the
request on the server's batcher exactly as the in-process handlers do (waiting out a weight update, up to
`pause_timeout_s`, then a 503) and answers with the result, the tokens of a stream as the engine reports them,
or an error; the server records every sample under its session here, and `match` / `remember` reach the one
`Threads` store, so a session's calls may land on any front end. A front end that goes away (closed or died)
only loses its own answers: its queued requests are cancelled, its running ones finish and are recorded, and
nothing here ever waits on it (posts to a closed channel are dropped). A request still waiting out a weight
update when its front end cancels it or goes away is dropped as soon as it is queued (`_Peer.pending`), and
one that fails before it reaches the engine (a bug, not a 503) is answered with a 500, never left waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ascent.rollout.server.batcher import BatchResult, StreamingEngine
from ascent.rollout.server.errors import APIError
from ascent.rollout.server.front import engine_error
from ascent.rollout.server.ipc import Channel, error_to_wire, generation_to_wire, request_from_wire

if TYPE_CHECKING:
    from ascent.rollout.server.server import OpenAIServer

logger = logging.getLogger(__name__)


class _Peer:
    """One connected front end: its channel, its pid once it said hello, its requests still in the engine,
    those not queued yet (`pending`: `server.submit` may wait out a weight update) and which of those it
    cancelled meanwhile (`dropped`)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.pid: int | None = None
        self.jobs: dict[int, Future[BatchResult]] = {}
        self.pending: set[int] = set()
        self.dropped: set[int] = set()

    def settle(self, rid: int) -> bool:
        """`rid` left `pending` (queued or refused) -> whether its answer is no longer wanted (cancelled
        meanwhile, or the front end is gone)."""
        self.pending.discard(rid)
        dropped = rid in self.dropped
        self.dropped.discard(rid)
        return dropped or self.channel.closed


class EngineHub:
    """See the module docstring. `start()` returns once the socket listens at `path`."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self._dir = tempfile.mkdtemp(prefix="ascent-api-")
        self.path = os.path.join(self._dir, "engine.sock")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None  # why the socket could not listen
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._cond = threading.Condition()
        self.peers: dict[int, _Peer] = {}  # by pid: the front ends connected now
        self.requests: Counter[int] = Counter()  # engine requests submitted, by front-end pid

    # ---- lifecycle (any thread) --------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread = threading.Thread(target=self._run, name="ascent-engine-hub", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the engine hub did not listen on {self.path} within {timeout_s:g} s")
        if self._failed is not None:
            self.close()
            raise RuntimeError(
                f"the engine hub cannot listen on {self.path} ({type(self._failed).__name__}: "
                f"{self._failed}); if the path is longer than a unix socket allows (107 bytes on Linux), set "
                "TMPDIR to a shorter directory."
            ) from self._failed

    def close(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
        shutil.rmtree(self._dir, ignore_errors=True)

    def wait_connected(self, pids: set[int], timeout_s: float, alive: Callable[[], bool]) -> bool:
        """Wait until every process of `pids` has said hello; False once `alive()` is False or on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not pids <= set(self.peers):
                if not alive() or time.monotonic() > deadline:
                    return False
                self._cond.wait(0.1)  # woken by a hello; a death is seen by polling `alive`
        return alive()

    # ---- the loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            listener = await asyncio.start_unix_server(self._serve, path=self.path)
        except Exception as err:  # start() raises it
            self._failed = err
            return
        finally:
            self._ready.set()
        async with listener:
            await self._stop.wait()
        for peer in list(self.peers.values()):
            peer.channel.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _Peer(Channel(reader, writer))
        try:
            async for message in peer.channel.messages():
                self._handle(peer, message)
        finally:
            peer.channel.close()
            for future in list(peer.jobs.values()):
                future.cancel()  # queued ones are dropped; running ones finish (and are recorded)
            with self._cond:
                if peer.pid is not None and self.peers.get(peer.pid) is peer:
                    del self.peers[peer.pid]
                self._cond.notify_all()

    def _handle(self, peer: _Peer, message: list[Any]) -> None:
        kind, rid, *rest = message
        reply = peer.channel.post
        if kind == "submit":
            self.requests[peer.pid or 0] += 1
            peer.pending.add(rid)  # before the task runs: a cancel right behind it finds it
            task = asyncio.ensure_future(self._submit(peer, rid, *rest))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == "cancel":
            if rid in peer.pending:  # not queued yet: `_submit` drops it once it is
                peer.dropped.add(rid)
            future = peer.jobs.pop(rid, None)
            if future is not None:
                future.cancel()
        elif kind == "match":
            session, digests, assistant_at = rest
            reply(["reply", rid, self.server.threads.match(session, digests, assistant_at)])
        elif kind == "remember":
            session, length, digest, ids = rest
            self.server.threads.remember(session, length, digest, ids)
            reply(["reply", rid, None])
        elif kind == "health":
            reply(["reply", rid, self.server.health_now()])
        elif kind == "hello":
            with self._cond:
                peer.pid = rid
                self.peers[rid] = peer
                self._cond.notify_all()
        else:
            logger.error("a front-end process sent an unknown message %r; ignored", kind)

    async def _submit(
        self,
        peer: _Peer,
        rid: int,
        session: str,
        endpoint: Any,
        completion_id: str,
        first_index: int,
        stream: bool,
        wire: list[Any],
    ) -> None:
        post = peer.channel.post
        on_token = None
        if stream and isinstance(self.server.batcher.engine, StreamingEngine):

            def on_token(index: int, token_id: int, logprob: float) -> None:
                post(["token", rid, index, token_id, logprob])

        try:
            future = await self.server.submit(
                request_from_wire(wire), session, endpoint, completion_id, on_token, first_index
            )
        except Exception as err:
            peer.settle(rid)
            self._refuse(peer, rid, err)
            return
        if peer.settle(rid):  # cancelled while it waited, or its front end is gone: neither run nor record it
            future.cancel()  # (one the batcher already started finishes and is recorded, as in `_serve`)
            return
        if stream:
            post(["queued", rid])  # before the result can be posted: the done callback comes after this
        peer.jobs[rid] = future
        future.add_done_callback(lambda f: self._answer(peer, rid, f))

    @staticmethod
    def _refuse(peer: _Peer, rid: int, err: Exception) -> None:
        """`server.submit` raised: a 503 (paused too long, shutting down) as it is, anything else (a bug)
        logged and answered as the 500 an engine failure gets, so the front end never waits forever."""
        if not isinstance(err, APIError):
            logger.error(
                "a request of front end %s failed before reaching the engine", peer.pid, exc_info=err
            )
            err = engine_error(err)
        peer.channel.post(["error", rid, error_to_wire(err)])

    def _answer(self, peer: _Peer, rid: int, future: Future[BatchResult]) -> None:
        """The request is done (on the batcher's thread, or here if it already was): its answer to the
        peer."""
        peer.jobs.pop(rid, None)
        if future.cancelled():
            return
        err = future.exception()
        if err is not None:  # the same 500 the in-process handlers give (an APIError as it is)
            api_error = err if isinstance(err, APIError) else engine_error(err)
            peer.channel.post(["error", rid, error_to_wire(api_error)])
            return
        result = future.result()
        gens = [generation_to_wire(g) for g in result.generations]
        peer.channel.post(["result", rid, result.policy_version, gens])
