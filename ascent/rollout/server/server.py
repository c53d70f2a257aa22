"""`OpenAIServer`: the policy behind an OpenAI-compatible HTTP API (design: "Agents written against the OpenAI
API can be trained too"; the package map's "HTTP server" in `ascent.rollout`).

It ties together an engine (owned by the `Batcher` thread), a tokenizer, the `Recorder` and the FastAPI app
(`app.py`), and `Threads`, which lets an agent's next call continue the exact ids of the reply it echoes. It
runs in the foreground (`run`, what `ascent serve` does) or on a background thread (`start`, for tests and
for a training loop that serves its own policy). Weight updates go through `paused()`: new requests wait (up
to `pause_timeout_s`, then 503 with Retry-After) while the running ones finish and the weights are swapped;
`update_weights` does all of it and bumps the policy version the records carry.

With `api_processes=1` the HTTP handlers run in this process, on uvicorn's event loop. With N > 1 they run in
N front-end processes sharing the listening socket (`pool.py`, `frontend.py`), which send only token ids and
sampling params here (`hub.py`), so the per-request host work no longer competes with the engine's loop for
this interpreter. Either way the batcher, the recorder and the threads live here: `take`, `pause` and
`update_weights` work the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any

from ascent.messages import GenerationRequest
from ascent.models.vision import ImageCodec
from ascent.rollout.base import RolloutEngine
from ascent.rollout.constraints import LLGuidanceConstraints
from ascent.rollout.reference import ReferenceEngine
from ascent.rollout.server.app import build_app
from ascent.rollout.server.batcher import Batcher, BatchResult, EnginePaused, TokenCallback
from ascent.rollout.server.front import Front, unavailable
from ascent.rollout.server.frontend import FrontendSpec, hold_port
from ascent.rollout.server.hub import EngineHub
from ascent.rollout.server.options import ServerOptions, uvicorn_config
from ascent.rollout.server.pool import FrontendPool
from ascent.rollout.server.recorder import CompletionRecord, Endpoint, Recorder
from ascent.rollout.server.threads import Threads

logger = logging.getLogger(__name__)


class OpenAIServer(Front):
    """See the module docstring. `engine` is used only from the batcher thread once the server starts."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        options: ServerOptions,
        *,
        recorder: Recorder | None = None,
        policy_version: int = 0,
        codec: ImageCodec | None = None,
    ) -> None:
        if options.api_processes < 1:
            raise ValueError(f"api_processes={options.api_processes}: set it to 1 or more.")
        if isinstance(engine, ReferenceEngine):  # it samples under a grammar given a constraint factory
            if engine.constraints is None:
                engine.constraints = LLGuidanceConstraints(tokenizer)
            options = dataclasses.replace(options, constrained_decoding=True)
        super().__init__(tokenizer, options, codec)
        seeded_alone = isinstance(
            engine, ReferenceEngine
        )  # its seeded requests repeat whatever else is queued
        self.batcher = Batcher(
            engine, options.max_batch_requests, policy_version, isolate_seeded=seeded_alone
        )
        self.recorder = recorder if recorder is not None else Recorder(options.max_records, self.decode)
        self.threads = Threads()  # finished replies, so a call that echoes one continues its exact ids
        self.app = build_app(self)
        self.url: str | None = None
        self.frontends: Any = None  # the FrontendPool when api_processes > 1
        self._hub: Any = None
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None

    @property
    def policy_version(self) -> int:
        return self.batcher.policy_version

    # ---- running -----------------------------------------------------------------------------------------

    def _bind(self, host: str, port: int) -> socket.socket:
        """The listening socket (one process), or the bound one holding the port for the front ends."""
        if self.options.api_processes > 1:
            sock = hold_port(host, port)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.create_server((host, port), family=family, backlog=2048)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{sock.getsockname()[1]}/v1"
        return sock

    def start(self, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> str:
        """Serve on a background thread (port 0: a free port); return the base URL once it accepts. If it
        cannot start, everything it started is stopped before the error is raised."""
        sock = self._bind(host, port)
        self.batcher.start()
        try:
            if self.options.api_processes > 1:
                self._start_frontends(sock, host, log_level)
            else:
                self._start_uvicorn(sock, host, port, log_level)
        except BaseException:  # leave no batcher or hub thread, temporary directory or bound port behind
            sock.close()
            self.stop()
            raise
        assert self.url is not None
        return self.url

    def _start_uvicorn(self, sock: socket.socket, host: str, port: int, log_level: str) -> None:
        import uvicorn  # deferred: only a process that serves HTTP needs it

        self._uvicorn = uvicorn.Server(uvicorn_config(self.app, host, log_level))
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [sock]}, name="ascent-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start on {host}:{port} within 30 s")
            time.sleep(0.01)

    def run(
        self, host: str, port: int, log_level: str = "info", on_bound: Callable[[str], None] | None = None
    ) -> None:
        """Serve in the foreground until SIGINT/SIGTERM: uvicorn (or, with front-end processes, the caller's
        signal handler) stops it gracefully. `on_bound(url)` is called once the port is bound. Raises
        `pool.FrontendError` if the front-end processes cannot be started or kept running."""
        import uvicorn  # deferred: only a process that serves HTTP needs it

        sock = self._bind(host, port)
        if on_bound is not None:
            assert self.url is not None
            on_bound(self.url)
        self.batcher.start()
        try:
            if self.options.api_processes > 1:
                self._start_frontends(sock, host, log_level)
                self.frontends.wait()
            else:
                self._uvicorn = uvicorn.Server(uvicorn_config(self.app, host, log_level))
                self._uvicorn.run(sockets=[sock])
        finally:
            sock.close()
            self._stop_frontends()
            self.batcher.close()

    def _start_frontends(self, sock: socket.socket, host: str, log_level: str) -> None:

        self._hub = EngineHub(self)
        self._hub.start()
        port = int(sock.getsockname()[1])
        spec = FrontendSpec(self._hub.path, self.options, self.tokenizer, host, port, log_level, self.codec)
        self.frontends = FrontendPool(self._hub, sock, spec, self.options.api_processes)
        self.frontends.start()

    def _stop_frontends(self) -> None:
        if self.frontends is not None:
            self.frontends.stop()
        if self._hub is not None:
            self._hub.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the background server started by `start` and the batcher, joining their threads (the log
        names an HTTP thread still running `timeout_s` after the batcher stopped)."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._stop_frontends()
        self.batcher.close()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout_s)  # its requests that waited on the batcher have their answer now
            if self._thread.is_alive():
                logger.warning("the HTTP server at %s did not stop within %g s", self.url, 2 * timeout_s)

    def take(self, session: str) -> list[CompletionRecord]:
        """Drain `session`'s records (oldest first) and forget its conversations: the session is over."""
        self.threads.forget(session)
        return self.recorder.drain(session)

    # ---- weight updates ----------------------------------------------------------------------------------

    def pause(self, timeout_s: float = 600.0) -> None:
        """New requests wait (then 503); returns once running requests are done and the engine is idle."""
        self.batcher.pause(timeout_s)

    def resume(self) -> None:
        self.batcher.resume()

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 600.0) -> Iterator[None]:
        self.pause(timeout_s)
        try:
            yield
        finally:
            self.resume()

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Pause, load the (name, tensor) pairs into the engine, set the policy version, resume."""
        with self.paused():
            self.batcher.engine.update_weights(named_tensors)
            self.batcher.policy_version = version

    # ---- Front: the engine, here (called on an event loop: uvicorn's, or the hub's) ----------------------

    async def submit(
        self,
        request: GenerationRequest,
        session: str,
        endpoint: Endpoint,
        completion_id: str,
        on_token: TokenCallback | None = None,
        first_index: int = 0,
    ) -> Future[BatchResult]:
        started, deadline = time.time(), time.monotonic() + self.options.pause_timeout_s
        if request.params.n == 1 and request.session_id is None:  # the fast engine keeps the session's KV
            request = dataclasses.replace(request, session_id=f"http:{session}")
        while True:
            try:
                future = self.batcher.submit(request, on_token)
                break
            except EnginePaused:
                if time.monotonic() >= deadline:
                    raise unavailable(
                        "the model's weights are being updated", self.options.retry_after_s
                    ) from None
                await asyncio.sleep(0.02)
            except RuntimeError as err:  # shutting down
                raise unavailable(str(err), self.options.retry_after_s) from None
        # recorded on the batcher's thread as the request ends, before anyone waiting on it hears of it
        future.add_done_callback(
            lambda f: self._record(f, request, session, endpoint, completion_id, first_index, started)
        )
        return future

    def health_now(self) -> dict[str, Any]:
        return {"status": "ok", "policy_version": self.policy_version, "paused": self.batcher.paused}

    async def health(self) -> dict[str, Any]:
        return self.health_now()

    async def _match(
        self, session: str, digests: list[bytes], assistant_at: int
    ) -> tuple[int, list[int]] | None:
        return self.threads.match(session, digests, assistant_at)

    async def _remember(self, session: str, length: int, digest: bytes, ids: list[int]) -> None:
        self.threads.remember(session, length, digest, ids)

    def _record(
        self,
        future: Future[BatchResult],
        request: GenerationRequest,
        session: str,
        endpoint: Endpoint,
        completion_id: str,
        first_index: int,
        started: float,
    ) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        result = future.result()
        for index, gen in enumerate(result.generations):
            self.recorder.record(
                CompletionRecord(
                    session_id=session,
                    completion_id=completion_id,
                    index=first_index + index,
                    endpoint=endpoint,
                    prompt_ids=list(request.prompt_ids),
                    response_ids=list(gen.token_ids),
                    logprobs=list(gen.logprobs),
                    finish_reason=gen.finish_reason,
                    policy_version=result.policy_version,
                    token_versions=list(gen.token_versions),
                    started=started,
                    images=request.images,
                    forced=list(gen.forced),
                )
            )
