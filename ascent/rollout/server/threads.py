"""Token-exact continuation of a conversation across chat calls (`ascent.rollout.server`).

An agent's loop sends the whole conversation with every call: the earlier messages, the reply it got (with
its tool calls), then tool results or a new user turn. Rendering that history again with the chat template
can give other ids than the ones the model sampled (JSON of a tool call re-serialised, a template that drops
past `<think>` blocks, text that tokenizes differently), and training on ids the model never produced is the
field's classic bug. So the server remembers, per session, each finished reply: the messages it answered,
the reply as the client will echo it, and the exact ids (prompt + sampled reply, ending on the end-of-turn
token). A later call whose messages start with such a remembered conversation is prompted with those ids
plus the ids the template appends for the new messages (`ChatTokens.continuation_ids`, as multi-turn
episodes do); any other call is rendered from scratch. Then every call of an agent loop extends the ids of
the call before it, which is what `ascent.orchestrator.agents` needs to assemble one episode from them.

A conversation is compared by digests: `conversation_digests` gives one 16-byte digest per prefix (the tools,
then each message: role, text, tool calls by name and parsed arguments; call ids and JSON spacing do not
count), so the front end that renders a call (`front.py`) sends only digests to the `Threads` store, which
lives with the engine (`hub.py`): a session's calls may land on different front-end processes.

Bounded: `max_sessions` sessions (least recently used go first), `per_session` replies each.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def message_key(m: dict[str, Any]) -> str:
    """A template message (see `chat.template_messages`) as canonical JSON: role, text, tool calls by name
    and parsed arguments (call ids and JSON spacing do not count)."""
    calls = [
        [c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True)]
        for c in m.get("tool_calls") or ()
    ]
    return json.dumps([m["role"], (m.get("content") or "").strip(), calls, m.get("tool_call_id")])


def conversation_digests(messages: Sequence[dict[str, Any]], tools: Any) -> list[bytes]:
    """[digest of the tools, of the tools + messages[0], ..., of the tools + all messages]: prefix i + 1 of
    a conversation has digest i, so a remembered conversation of length k matches `digests[k - 1]`."""
    h = hashlib.blake2b(json.dumps(tools, sort_keys=True).encode(), digest_size=16)
    out = [h.digest()]
    for m in messages:
        h = hashlib.blake2b(out[-1] + message_key(m).encode(), digest_size=16)
        out.append(h.digest())
    return out


def last_assistant(messages: Sequence[dict[str, Any]]) -> int:
    """The index of the last assistant message (-1: none); a continuation may add none after the reply."""
    return max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)


@dataclass(frozen=True)
class _Reply:
    length: int  # prefixes of the conversation it closes: the tools, the request's messages, the reply
    digest: bytes  # conversation_digests(messages + [reply], tools)[-1]
    ids: list[int]  # prompt ids + the reply's sampled ids (ending on the end-of-turn token)


class Threads:
    """Remembered replies by session (see the module docstring). Thread-safe."""

    def __init__(self, max_sessions: int = 10_000, per_session: int = 16) -> None:
        self.max_sessions, self.per_session = max_sessions, per_session
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, deque[_Reply]] = OrderedDict()
        self.continued = 0  # lookups that found a remembered reply to continue

    def remember(self, session: str, length: int, digest: bytes, ids: list[int]) -> None:
        """The conversation of `length` prefixes with `digest` ended on a reply; `ids` is all of it."""
        entry = _Reply(length, bytes(digest), list(ids))
        with self._lock:
            replies = self._sessions.pop(session, None) or deque(maxlen=self.per_session)
            replies.append(entry)
            self._sessions[session] = replies
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)

    def match(
        self, session: str, digests: Sequence[bytes], assistant_at: int
    ) -> tuple[int, list[int]] | None:
        """(length, ids) of the longest remembered conversation of `session` that the call's conversation
        (`digests`, see `conversation_digests`) extends with non-assistant messages only (`assistant_at`: the
        call's last assistant message, see `last_assistant`), or None: render from scratch."""
        with self._lock:
            replies = list(self._sessions.get(session, ()))
        best: _Reply | None = None
        for r in replies:
            if r.length < len(digests) and digests[r.length - 1] == r.digest:
                best = r if best is None or r.length > best.length else best
        if best is None or best.length - 1 <= assistant_at:  # messages[length - 1:] are the new ones
            return None
        with self._lock:
            self.continued += 1
        return best.length, best.ids

    def forget(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)
