"""Response bodies of the OpenAI-compatible endpoints, whole and as stream chunks (`ascent.rollout.server`).

Plain dicts in OpenAI's shapes (`chat.completion`, `chat.completion.chunk`, `text_completion`), built from
the engine's `Generation`s. Logprobs are the sampler's logprob of each sampled token (the engine records no
alternatives, so `top_logprobs` lists are empty). With `return_token_ids` (a vLLM extension) the response
also carries `prompt_token_ids` and each choice's `token_ids`, exactly as sampled.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ascent.messages import Generation

Decode = Callable[[list[int]], str]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Meta:
    """What every body of one completion repeats."""

    completion_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.completion_id, "object": kind, "created": self.created, "model": self.model}


def usage(prompt_lens: Sequence[int], samples: Sequence[Generation], cached: int = 0) -> dict[str, Any]:
    """OpenAI's usage block; `cached`: prompt tokens whose K/V the engine kept from the session's last
    call."""
    prompt, completion = sum(prompt_lens), sum(len(g.token_ids) for g in samples)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chat_logprobs(token_ids: Sequence[int], logprobs: Sequence[float], piece: Decode) -> dict[str, Any]:
    """Chat's `logprobs.content`: one entry per sampled token (its text, logprob, UTF-8 bytes)."""
    content = []
    for token_id, logprob in zip(token_ids, logprobs, strict=True):
        text = piece([token_id])
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content}


def completion_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[float], piece: Decode, start: int = 0
) -> dict[str, Any]:
    """The legacy completions' logprobs: tokens, token_logprobs, text_offset from `start` (no
    top_logprobs)."""
    tokens = [piece([t]) for t in token_ids]
    offsets, at = [], start
    for tok in tokens:
        offsets.append(at)
        at += len(tok)
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": offsets}


def chat_choice(
    index: int,
    content: str | None,
    tool_calls: list[dict[str, Any]],
    finish_reason: str,
    logprobs: dict[str, Any] | None,
    token_ids: list[int] | None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def completion_choice(
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: dict[str, Any] | None,
    token_ids: list[int] | None,
) -> dict[str, Any]:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def chat_chunk(
    meta: Meta,
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {**meta.head("chat.completion.chunk"), "choices": [choice]}


def usage_chunk(meta: Meta, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return {**meta.head(kind), "choices": [], "usage": body}
