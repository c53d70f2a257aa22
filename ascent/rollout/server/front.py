"""`Front`: what the HTTP handlers need from the server, whichever process they run in
(`ascent.rollout.server`).

The handlers (`handlers.py`, `app.py`) do all the per-request host work (parse, validate, render the chat
template, tokenize, detokenize, write JSON or SSE) and talk to the engine only through this interface:
`submit` an engine request (token ids and sampling params) and get a `Future[BatchResult]`, look up and
remember finished replies for token-exact continuation (`threads.py`, by digests), ask for `health`. Two
implementations: `OpenAIServer` (`server.py`: the engine is in this process, one HTTP process) and
`RemoteFront` (`frontend.py`: a front-end process of `--api-processes N`, talking to the engine process over
a socket). Session state (recorder, threads) always lives with the engine, so a session's calls may land on
any front end.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ascent.envs.chat import ChatTokens
from ascent.messages import GenerationRequest
from ascent.models.vision import ImageCodec
from ascent.rollout.server.batcher import BatchResult, TokenCallback
from ascent.rollout.server.errors import APIError
from ascent.rollout.server.recorder import Endpoint
from ascent.rollout.server.threads import conversation_digests, last_assistant
from ascent.rollout.server.tool_parsers import tool_parser

if TYPE_CHECKING:
    from ascent.rollout.server.options import ServerOptions


class Front(ABC):
    """See the module docstring. `tokenizer` is a Hugging Face tokenizer; `options` the server's; `codec` a
    vision-language model's `ImageCodec` (`ascent.models.vision`; None: a text model, images refused)."""

    def __init__(self, tokenizer: Any, options: ServerOptions, codec: ImageCodec | None = None) -> None:
        self.tokenizer, self.options, self.codec = tokenizer, options, codec
        self.chat = ChatTokens(tokenizer)
        self.tool_parser_name, self.tool_parser = tool_parser(options.tool_parser, tokenizer)
        self._specials = frozenset(getattr(tokenizer, "all_special_ids", ()) or ()) | {tokenizer.eos_token_id}

    # ---- text helpers ------------------------------------------------------------------------------------

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def piece(self, ids: list[int]) -> str:
        """A token's own text for logprobs, special tokens included."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def tool_text(self, ids: list[int]) -> str:
        """A reply's text for the tool parser: special tokens kept (Mistral's `[TOOL_CALLS]`, Llama's
        `<|python_tag|>`), the final end-of-turn token left out."""
        return self.piece(ids[:-1] if ids and ids[-1] in self._specials else ids)

    # ---- the engine --------------------------------------------------------------------------------------

    @abstractmethod
    async def submit(
        self,
        request: GenerationRequest,
        session: str,
        endpoint: Endpoint,
        completion_id: str,
        on_token: TokenCallback | None = None,
        first_index: int = 0,
    ) -> Future[BatchResult]:
        """Queue `request` (waiting out a weight update, up to pause_timeout_s, then a 503); the engine side
        records its samples under `session` once it is done. `on_token(index, token, logprob)` gets every
        sampled token (sample index shifted by nothing: callers offset it) before the future is done."""

    async def generate(
        self, request: GenerationRequest, session: str, endpoint: Endpoint, completion_id: str
    ) -> BatchResult:
        return await result_of(await self.submit(request, session, endpoint, completion_id))

    @abstractmethod
    async def health(self) -> dict[str, Any]:
        """{"status": "ok", "policy_version": int, "paused": bool}"""

    # ---- remembered replies (threads.py) -----------------------------------------------------------------

    @abstractmethod
    async def _match(
        self, session: str, digests: list[bytes], assistant_at: int
    ) -> tuple[int, list[int]] | None: ...

    @abstractmethod
    async def _remember(self, session: str, length: int, digest: bytes, ids: list[int]) -> None: ...

    async def remembered_ids(
        self, session: str, messages: Sequence[dict[str, Any]], tools: Any
    ) -> list[int] | None:
        """The ids of `messages` continuing a remembered reply of `session`, or None (render from scratch)."""
        found = await self._match(session, conversation_digests(messages, tools), last_assistant(messages))
        if found is None:
            return None
        length, ids = found
        try:
            return ids + self.chat.continuation_ids(messages[length - 1 :])
        except ValueError:  # the template rewrites earlier turns: render from scratch
            return None

    async def remember(
        self,
        session: str,
        messages: Sequence[dict[str, Any]],
        tools: Any,
        reply: dict[str, Any],
        ids: list[int],
    ) -> None:
        """`reply` (a template message: role assistant, content, tool_calls) answered `messages` with `ids`;
        returns once the store has it, so the client's next call (on any front end) finds it."""
        digest = conversation_digests([*messages, reply], tools)[-1]
        await self._remember(session, len(messages) + 2, digest, ids)


async def result_of(future: Future[BatchResult]) -> BatchResult:
    """Await the engine's future; an engine failure is a 500 in OpenAI's shape."""
    try:
        return await asyncio.wrap_future(future)
    except APIError:
        raise
    except Exception as err:
        raise engine_error(err) from err


def engine_error(err: BaseException) -> APIError:
    """The engine's failure (or the batcher's refusal when shutting down) as a 500 in OpenAI's shape."""
    return APIError(500, f"the engine failed: {type(err).__name__}: {err}", kind="server_error")


def unavailable(why: str, retry_after_s: int) -> APIError:
    """A 503 with Retry-After: the engine is being updated or is going away."""
    return APIError(
        503,
        f"{why}; retry in {retry_after_s} s.",
        code="engine_paused",
        kind="server_error",
        headers={"Retry-After": str(retry_after_s)},
    )
