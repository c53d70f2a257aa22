"""What the HTTP server generated, token-exact, per session (`ascent.rollout.server`; no HTTP in here).

Every sample the server returns is recorded as a `CompletionRecord`: the prompt ids the engine saw, the
response ids it sampled, the sampler's logprob of each, the policy version of the weights, the finish
reason, which sampled tokens a grammar forced (`response_format`, guided decoding: the engine allowed that
token alone), keyed by a session (the `X-Session-Id` header, else the caller's API key). Training on an agent
that talks to the server (design: "Agents written against the OpenAI API can be trained too") drains a
session's records into episodes: nothing is re-tokenized from the text the agent saw.

A record's `response_text` is decoded when it is read (`drain`, `peek`) with the recorder's `decode`, not
when it is recorded: detokenizing is the front ends' work, and the engine's process only records.

The recorder is bounded (`max_records`): past it, records of the session held longest are dropped, oldest
first, and counted in `dropped`, so a server nobody drains cannot grow without limit. A `sink` (a callable,
e.g. `ascent serve --record`'s experience store) also gets every record as it is recorded, whatever is
drained or dropped later; a sink that raises is logged and the record is kept all the same.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from ascent.messages import FinishReason, ImageInput, sampled_loss_mask

Endpoint = Literal["chat", "completions"]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompletionRecord:
    """One returned sample. `response_ids`, `logprobs` (and `token_versions` when the engine stamps them,
    `forced` when a grammar forced some of them) have one entry per sampled token, stop tokens included,
    exactly as the engine produced them."""

    session_id: str
    completion_id: str
    index: int  # the choice's index within its completion (n > 1)
    endpoint: Endpoint
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    token_versions: list[int] = field(default_factory=list)
    response_text: str = ""
    created: float = field(default_factory=time.time)  # when it completed
    started: float = field(default_factory=time.time)  # when the server received the call
    images: tuple[ImageInput, ...] = ()  # the images the prompt showed (one per image-pad run, in order)
    # per sampled token, True where a grammar allowed that token alone (`Generation.forced`); empty: none
    forced: list[bool] = field(default_factory=list)

    def loss_mask(self) -> list[int]:
        """1 per sampled token the policy chose, 0 per token its grammar forced (`sampled_loss_mask`)."""
        return sampled_loss_mask(self.forced, len(self.response_ids))


class Recorder:
    """Thread-safe, in-memory store of `CompletionRecord`s by session, in the order they completed.
    `decode(ids) -> text` fills each record's `response_text` as it is read (None: left as recorded);
    `sink(record)` is called with every record as it is recorded."""

    def __init__(
        self,
        max_records: int = 100_000,
        decode: Callable[[list[int]], str] | None = None,
        sink: Callable[[CompletionRecord], None] | None = None,
    ) -> None:
        if max_records < 1:
            raise ValueError(f"max_records={max_records}: set it to 1 or more.")
        self.max_records, self.decode, self.sink = max_records, decode, sink
        self.dropped = 0
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, deque[CompletionRecord]] = OrderedDict()
        self._count = 0

    def record(self, record: CompletionRecord) -> None:
        with self._lock:
            self._sessions.setdefault(record.session_id, deque()).append(record)
            self._count += 1
            while self._count > self.max_records:
                self._drop_oldest()
        if self.sink is not None:
            try:
                self.sink(record)
            except Exception:  # the sink's failure (a full disk) must not fail the request
                logger.exception("the recorder's sink failed on a record of session %s", record.session_id)

    def drain(self, session_id: str) -> list[CompletionRecord]:
        """The session's records, oldest first; they are removed from the recorder."""
        with self._lock:
            records = list(self._sessions.pop(session_id, ()))
            self._count -= len(records)
        return self._texts(records)

    def peek(self, session_id: str) -> list[CompletionRecord]:
        """The session's records, oldest first, left in place."""
        with self._lock:
            records = list(self._sessions.get(session_id, ()))
        return self._texts(records)

    def _texts(self, records: list[CompletionRecord]) -> list[CompletionRecord]:
        if self.decode is None:
            return records
        decode = self.decode
        return [replace(r, response_text=decode(r.response_ids)) for r in records]

    def sessions(self) -> list[str]:
        """Sessions holding records, the one whose first record is oldest first."""
        with self._lock:
            return list(self._sessions)

    def __len__(self) -> int:
        return self._count

    def _drop_oldest(self) -> None:
        session, records = next(iter(self._sessions.items()))
        records.popleft()
        self._count -= 1
        self.dropped += 1
        if not records:
            del self._sessions[session]
