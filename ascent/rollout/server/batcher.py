"""The batcher: one thread owns the rollout engine; HTTP handlers queue requests for it
(`ascent.rollout.server`).

Requests from any number of handlers wait in one queue. The batcher thread takes everything queued (up to
`max_batch_requests`) and runs one engine call on it, so concurrent requests are served together. The
reference engine decodes a call's rows in padded batches of `generation_batch_size`, and a request that
arrives during its call waits for the next one. The fast engine (`LiveEngine`) takes requests in the middle
of a call: between decode steps it asks the batcher for what was queued since (those whose sampling fits the
call), and each request is answered as soon as its samples end (continuous batching).

Streaming: an engine that implements `StreamingEngine.generate_streaming` reports each token as it is
sampled and the batcher passes it straight on; for any other engine (the reference and fast engines today)
the batcher replays a generation's tokens to the request's `on_token` callback right after the call returns,
so a stream then arrives in one burst at the end, through the same interface.

Determinism: with `isolate_seeded` (`OpenAIServer` sets it for the reference engine) a seeded request runs
in a call of its own, so its tokens and logprobs are the same whatever else was queued with it (batched, its
rows would be padded and multiplied with other rows, which changes float sums and, at a near tie, the
sampled token). Unseeded requests still share calls. The fast engine's continuous batching is not split:
its bf16 kernels depend on the batch (README, "Serving the policy over the OpenAI API").

A call that starts on an idle engine first gathers: it waits until no request has arrived for `gather_s`
(2 ms; at most 4 x gather_s in all), so a burst of requests (many clients at once) starts in one prefill
instead of the first request's prefill running alone ahead of the rest. A lone request pays one gather_s.

`pause()` stops taking new requests, lets the queued and running ones finish and returns with the engine
idle, so weights can be swapped safely; `resume()` opens the queue again. The policy version each batch ran
with is returned with its generations.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ascent.messages import Generation, GenerationRequest
from ascent.rollout.base import RolloutEngine

logger = logging.getLogger(__name__)

TokenCallback = Callable[[int, int, float], None]  # (sample index, token id, logprob)


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that reports tokens as they are sampled: `on_token(request position, sample index, token id,
    logprob)` is called (on the engine's thread) for every token before `generate_streaming` returns."""

    def generate_streaming(
        self, requests: list[GenerationRequest], on_token: Callable[[int, int, int, float], None]
    ) -> list[list[Generation]]: ...


@runtime_checkable
class LiveEngine(Protocol):
    """An engine that takes requests while it generates (the fast engine): see
    `ascent.rollout.fast.engine.FastEngine.generate_live`."""

    def generate_live(
        self,
        requests: list[GenerationRequest],
        more: Callable[[Callable[[GenerationRequest], bool]], list[GenerationRequest]],
        done: Callable[[int, list[Generation]], None],
    ) -> None: ...


class EnginePaused(RuntimeError):
    """The batcher takes no requests now (weights are being updated); wait and submit again."""


@dataclass(frozen=True)
class BatchResult:
    """The samples of one request and the policy version of the weights that produced them."""

    generations: list[Generation]
    policy_version: int


@dataclass(frozen=True)
class _Job:
    request: GenerationRequest
    future: Future[BatchResult]
    on_token: TokenCallback | None


class Batcher:
    """Owns `engine` on one thread; see the module docstring. Call `start()` before `submit`."""

    def __init__(
        self,
        engine: RolloutEngine,
        max_batch_requests: int = 256,
        policy_version: int = 0,
        gather_s: float = 0.002,
        isolate_seeded: bool = False,
    ) -> None:
        if max_batch_requests < 1:
            raise ValueError(f"max_batch_requests={max_batch_requests}: set it to 1 or more.")
        self.engine, self.gather_s, self.isolate_seeded = engine, gather_s, isolate_seeded
        self.max_batch_requests = max_batch_requests
        self.policy_version = policy_version
        self.calls = 0  # engine.generate calls made
        self.served = 0  # requests answered
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._busy = self._paused = self._closing = False
        self._thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ascent-batcher", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the running call, fail what is still queued, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cond:
            while self._queue:
                future = self._queue.popleft().future
                if future.set_running_or_notify_cancel():
                    future.set_exception(RuntimeError("the server is shutting down"))

    # ---- requests ----------------------------------------------------------------------------------------

    def submit(
        self, request: GenerationRequest, on_token: TokenCallback | None = None
    ) -> Future[BatchResult]:
        """Queue `request`; the future holds its samples. Raises EnginePaused while paused."""
        future: Future[BatchResult] = Future()
        with self._cond:
            if self._closing:
                raise RuntimeError("the server is shutting down")
            if self._paused:
                raise EnginePaused("weights are being updated")
            self._queue.append(_Job(request, future, on_token))
            self._cond.notify_all()
        return future

    # ---- pausing for weight updates ----------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self, timeout_s: float = 600.0) -> None:
        """Stop taking requests and wait until the queued and running ones are done (the engine is idle).

        Raises TimeoutError (and resumes) if the engine is still busy after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._paused = True
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._paused = False
                    raise TimeoutError(
                        f"pause: the engine was still generating after {timeout_s:g} s (timeout_s); the "
                        "server keeps serving. Retry, or give pause() more time."
                    )
                self._cond.wait(left)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    # ---- the engine thread -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                self._gather()
                take = min(len(self._queue), self.max_batch_requests)
                jobs = [self._queue.popleft() for _ in range(take)]
                self._busy, version = True, self.policy_version
            # a future cancelled while queued (its client left) is skipped; a running one cannot be cancelled
            batch = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            try:
                self._run(batch, version)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _gather(self) -> None:
        """(Lock held, requests queued, engine idle.) Wait until none arrives for gather_s (module doc)."""
        end = time.monotonic() + 4 * self.gather_s
        while not self._closing and len(self._queue) < self.max_batch_requests:
            seen, left = len(self._queue), min(self.gather_s, end - time.monotonic())
            if left <= 0:
                return
            self._cond.wait(left)  # a submit wakes it
            if len(self._queue) == seen:
                return

    def _run(self, batch: list[_Job], version: int) -> None:
        if not batch:
            return
        if isinstance(self.engine, LiveEngine) and not isinstance(self.engine, StreamingEngine):
            self._run_live(batch, version)
            return
        seeded = [job for job in batch if job.request.params.seed is not None] if self.isolate_seeded else []
        if seeded and len(batch) > 1:  # each seeded request in a call of its own (module docstring)
            for part in [[job for job in batch if job.request.params.seed is None], *([j] for j in seeded)]:
                self._run(part, version)
            return
        requests = [job.request for job in batch]
        live = isinstance(self.engine, StreamingEngine) and any(job.on_token for job in batch)
        try:
            if live:
                assert isinstance(self.engine, StreamingEngine)
                gens = self.engine.generate_streaming(requests, _dispatcher(batch))
            else:
                gens = self.engine.generate(requests)
        except Exception as err:  # a failed call fails its requests, not the server
            if len(batch) > 1 and not live:  # one by one, so only the request that breaks the engine fails
                logger.warning(
                    "engine.generate failed on %d requests (%s); retrying one by one", len(batch), err
                )
                for job in batch:
                    self._run([job], version)
                return
            logger.exception("engine.generate failed on %d requests", len(batch))
            for job in batch:
                job.future.set_exception(err)
            return
        self.calls += 1
        for job, samples in zip(batch, gens, strict=True):
            if job.on_token is not None and not live:
                _replay(job.on_token, samples)
            self.served += 1
            job.future.set_result(BatchResult(samples, version))

    def _run_live(self, batch: list[_Job], version: int) -> None:
        """One engine call that also takes the requests queued while it runs, answering each as it ends."""
        assert isinstance(self.engine, LiveEngine)
        jobs, answered = list(batch), [False] * len(batch)

        def more(fits: Callable[[GenerationRequest], bool]) -> list[GenerationRequest]:
            room = self.max_batch_requests - (len(jobs) - sum(answered))
            if room <= 0 or not self._queue:
                return []
            with self._cond:
                take = [job for job in self._queue if fits(job.request)][:room]
                for job in take:
                    self._queue.remove(job)
            new = [job for job in take if job.future.set_running_or_notify_cancel()]
            jobs.extend(new)
            answered.extend([False] * len(new))
            return [job.request for job in new]

        def done(i: int, samples: list[Generation]) -> None:
            answered[i] = True
            if jobs[i].on_token is not None:
                _replay(jobs[i].on_token, samples)  # type: ignore[arg-type]
            self.served += 1
            jobs[i].future.set_result(BatchResult(samples, version))

        try:
            self.engine.generate_live([job.request for job in batch], more, done)
        except Exception as err:  # a failed call fails the requests it had not answered
            logger.exception("engine.generate_live failed with %d requests unanswered", answered.count(False))
            for job, ok in zip(jobs, answered, strict=True):
                if not ok:
                    job.future.set_exception(err)
        self.calls += 1


def _dispatcher(batch: list[_Job]) -> Callable[[int, int, int, float], None]:
    def on_token(position: int, index: int, token_id: int, logprob: float) -> None:
        callback = batch[position].on_token
        if callback is not None:
            _safely(callback, index, token_id, logprob)

    return on_token


def _replay(callback: TokenCallback, samples: list[Generation]) -> None:
    for index, gen in enumerate(samples):
        for token_id, logprob in zip(gen.token_ids, gen.logprobs, strict=True):
            _safely(callback, index, token_id, logprob)


def _safely(callback: TokenCallback, index: int, token_id: int, logprob: float) -> None:
    try:
        callback(index, token_id, logprob)
    except Exception:  # a consumer's failure (a closed stream) must not stop the engine thread
        logger.exception("a token callback failed")
