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

Bounded: `max_sessions` sessions (least recently used go first), `per_session` replies each.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Key = tuple[Any, ...]


def message_key(m: dict[str, Any]) -> Key:
    """A template message (see `chat.template_messages`) as a comparable value: role, text, tool calls by
    name and parsed arguments (call ids and JSON spacing do not count)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in m.get("tool_calls") or ()
    )
    return (m["role"], (m.get("content") or "").strip(), calls, m.get("tool_call_id"))


def conversation_key(messages: Sequence[dict[str, Any]], tools: Any) -> Key:
    return (json.dumps(tools, sort_keys=True), *(message_key(m) for m in messages))


@dataclass(frozen=True)
class _Reply:
    key: Key  # conversation_key of the request's messages + the reply, as the client echoes it
    ids: list[int]  # prompt ids + the reply's sampled ids (ending on the end-of-turn token)


class Threads:
    """Remembered replies by session (see the module docstring). Thread-safe."""

    def __init__(self, max_sessions: int = 10_000, per_session: int = 16) -> None:
        self.max_sessions, self.per_session = max_sessions, per_session
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, deque[_Reply]] = OrderedDict()
        self.continued = 0  # calls prompted with remembered ids

    def remember(self, session: str, messages: Sequence[dict[str, Any]], tools: Any,
                 reply: dict[str, Any], ids: list[int]) -> None:  # fmt: skip
        """`reply` (a template message: role assistant, content, tool_calls) answered `messages` with `ids`."""
        entry = _Reply(conversation_key([*messages, reply], tools), list(ids))
        with self._lock:
            replies = self._sessions.pop(session, None) or deque(maxlen=self.per_session)
            replies.append(entry)
            self._sessions[session] = replies
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)

    def prompt_ids(
        self, session: str, messages: Sequence[dict[str, Any]], tools: Any, chat: Any
    ) -> list[int] | None:
        """The ids of `messages` continuing a remembered reply of `session`, or None (render from scratch).

        The longest remembered conversation that `messages` extend with non-assistant messages wins."""
        key = conversation_key(messages, tools)
        with self._lock:
            replies = list(self._sessions.get(session, ()))
        best: _Reply | None = None
        for r in replies:
            n = len(r.key)
            if n < len(key) and key[:n] == r.key and (best is None or n > len(best.key)):
                best = r
        if best is None:
            return None
        new = messages[len(best.key) - 1 :]  # key[0] is the tools
        if any(m["role"] == "assistant" for m in new):
            return None
        try:
            tail = chat.continuation_ids(new)
        except ValueError:  # the template rewrites earlier turns: render from scratch
            return None
        with self._lock:
            self.continued += 1
        return best.ids + tail

    def forget(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)
