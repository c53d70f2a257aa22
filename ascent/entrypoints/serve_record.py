"""`ascent serve --record DIR`: every sample the server returns, into `DIR/experience.db`, the experience
store training writes (`ascent.tracking.experience_store`), so `ascent episodes DIR` and the studio show what was
served.

Each sample is a one-turn episode with status `served`: its prompt ids, response ids (loss mask 1, 0 on the
tokens a grammar forced), the sampler's logprobs, the policy version, the finish reason; `row_id` numbers the
prompts the server was asked (the `n` samples of one prompt share it); `metadata` holds the session
(`X-Session-Id` or API key), the completion id, the choice index and the endpoint. Reward and advantage are not known to the server: 0 and
none. Records reach the store through `Recorder.sink` and `ExperienceWriter`'s background thread; the
response text is decoded as the record arrives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

from ascent.entrypoints.guard import ServeError
from ascent.messages import Episode
from ascent.rollout.server import CompletionRecord
from ascent.tracking.experience_store import open_store, store_path
from ascent.transport.store_writer import Entry, ExperienceWriter, prepare_store

STATUS = "served"
_KEEP_ALL = 2**62  # prepare_store keeps iterations up to this: an existing store keeps its episodes
_ROW_IDS_KEPT = 4096  # prompts whose row id is remembered (their samples arrive close together)


class RecordSink:
    """A `Recorder.sink` writing each record to the store in `directory`; `close()` writes what is queued."""

    def __init__(self, directory: str, tokenizer_dir: str, decode: Callable[[Sequence[int]], str]) -> None:
        path = store_path(directory)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            prepare_store(
                path, keep_through=_KEEP_ALL, meta={"tokenizer": str(Path(tokenizer_dir).resolve())}
            )
        except OSError as err:
            raise ServeError(
                f"--record {directory}: cannot write an experience store there ({err}); "
                "choose a writable directory."
            ) from err
        self.path, self.decode = path, decode
        self.writer = ExperienceWriter(path, decode)
        self._rows: OrderedDict[tuple[str, int], int] = OrderedDict()
        with open_store(path) as store:  # row ids go on from an earlier run's
            self._next = int(
                store.conn.execute("SELECT COALESCE(MAX(row_id) + 1, 0) FROM episodes").fetchone()[0]
            )
        self._lock = threading.Lock()

    def _row_id(self, record: CompletionRecord) -> int:
        key = (record.completion_id, hash(tuple(record.prompt_ids)))
        with self._lock:
            if key not in self._rows:
                self._rows[key], self._next = self._next, self._next + 1
                if len(self._rows) > _ROW_IDS_KEPT:
                    self._rows.popitem(last=False)
            return self._rows[key]

    def __call__(self, record: CompletionRecord) -> None:
        episode = Episode(
            prompt_ids=list(record.prompt_ids),
            response_ids=list(record.response_ids),
            sampler_logprobs=list(record.logprobs),
            loss_mask=record.loss_mask(),
            finish_reason=record.finish_reason,
            row_id=self._row_id(record),
            policy_version=record.policy_version,
            token_versions=list(record.token_versions),
            response_text=self.decode(record.response_ids),
            metadata={
                "session": record.session_id,
                "completion_id": record.completion_id,
                "index": record.index,
                "endpoint": record.endpoint,
                "started": record.started,
            },
        )
        self.writer.put([Entry(episode, iteration=0, status=STATUS, trainer_version=record.policy_version)])

    def close(self) -> None:
        self.writer.close()
