"""The bodies of `/v1/chat/completions` and `/v1/completions` (`ascent.rollout.server`; routes in `app.py`).

Each handler renders the prompt (a chat call that echoes an earlier reply of its session continues that
reply's exact ids: `threads.py`), checks it against the context, queues one engine request per prompt (all
queued before any is awaited, so they share a batch) and answers with a whole body or, with `stream=true`,
server-sent chunks. Chat replies with tools are parsed for tool calls in the model family's format
(`tool_parsers.py`); a streamed reply with tools is sent when the sample ends (its raw call text never
reaches the client).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse

from ascent.messages import Generation, GenerationRequest, ImageInput
from ascent.rollout.server.batcher import BatchResult
from ascent.rollout.server.chat import cut_at_stop, split_tool_calls
from ascent.rollout.server.errors import APIError
from ascent.rollout.server.front import Front, result_of
from ascent.rollout.server.grammar import request_grammar
from ascent.rollout.server.prepare import (
    chat_images,
    chat_inputs,
    chat_prompt,
    completion_prompts,
    expand_images,
    sampling_params,
    token_budget,
    with_grammar,
)
from ascent.rollout.server.responses import (
    Meta,
    chat_choice,
    chat_chunk,
    chat_logprobs,
    completion_choice,
    completion_logprobs,
    new_id,
    usage,
    usage_chunk,
)
from ascent.rollout.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingBody,
    refused_field,
)
from ascent.rollout.server.streaming import TextStream, TokenFeed, sse

Chunks = AsyncIterator[dict[str, Any]]


def check_model(server: Front, body: SamplingBody) -> None:
    """A field the server does not take is a 400 naming it; a model it does not serve is a 404."""
    refused = refused_field(body)
    if refused is not None:
        raise APIError(400, refused[1], param=refused[0], code="unsupported_parameter")
    name = server.options.model_name
    if body.model != name and not server.options.any_model:
        raise APIError(
            404,
            f"The model `{body.model}` does not exist; this server serves `{name}`.",
            param="model",
            code="model_not_found",
        )


def _streaming(chunks: Chunks) -> StreamingResponse:
    return StreamingResponse(
        sse(chunks), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _cached(generations: list[Generation]) -> int:
    """Prompt tokens of a chat call that the engine reused from its session's cache (0 on other engines)."""
    return generations[0].cached_tokens if generations else 0


def _wants_usage(body: SamplingBody) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


# ---- chat ------------------------------------------------------------------------------------------------


def _uses_tools(body: ChatCompletionRequest) -> bool:
    return bool(body.tools) and body.tool_choice != "none"


@dataclass(frozen=True)
class _Reply:
    """One sample as the client sees it; `cut`: a stop string ended it (its text stops before the ids do)."""

    content: str | None
    calls: list[dict[str, Any]]
    finish: str
    cut: bool


def _chat_replies(server: Front, body: ChatCompletionRequest, result: BatchResult) -> list[_Reply]:
    """Each sample's text cut at the stop strings and, with tools, split into content and tool calls."""
    out = []
    for gen in result.generations:
        text, cut = cut_at_stop(server.decode(gen.token_ids), body.stop_strings())
        split = None
        if _uses_tools(body):
            raw, _ = cut_at_stop(server.tool_text(list(gen.token_ids)), body.stop_strings())
            split = split_tool_calls(raw, server.tool_parser)
        content, calls = split if split is not None else (text, [])
        out.append(_Reply(content, calls, "tool_calls" if calls else gen.finish_reason, cut))
    return out


@dataclass(frozen=True)
class _Chat:
    """A chat call's session, its messages and tools as the template reads them, its prompt ids and the
    images they show."""

    session: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    images: tuple[ImageInput, ...] = ()


async def _remember(server: Front, call: _Chat, result: BatchResult, replies: list[_Reply]) -> None:
    """Keep each reply that ended on the end-of-turn token, so the call that echoes it continues its ids
    (`threads.py`); a reply cut by length or by a stop string is not a finished turn. A conversation with
    images is rendered afresh every call (the digests compare text only)."""
    if call.images:
        return
    eos = server.tokenizer.eos_token_id
    for gen, r in zip(result.generations, replies, strict=True):
        if gen.finish_reason != "stop" or r.cut or not gen.token_ids or gen.token_ids[-1] != eos:
            continue
        reply = {
            "role": "assistant",
            "content": r.content or "",
            "tool_calls": [
                {
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    }
                }
                for c in r.calls
            ],
        }
        await server.remember(
            call.session, call.messages, call.tools, reply, [*call.prompt_ids, *gen.token_ids]
        )


async def chat_completions(server: Front, body: ChatCompletionRequest, session: str) -> Any:
    check_model(server, body)
    limits = server.options.limits
    grammar = request_grammar(body.model_extra or {}, server.options.constrained_decoding)
    messages, tools = chat_inputs(body)
    messages, images = chat_images(messages, server.codec)
    prompt_ids = None if images else await server.remembered_ids(session, messages, tools)
    if prompt_ids is None:
        prompt_ids = expand_images(chat_prompt(server.chat, messages, tools), images, server.codec)
    call = _Chat(session, messages, tools, prompt_ids, images)
    budget = token_budget(len(prompt_ids), body.token_budget(), limits, "messages")
    request = GenerationRequest(prompt_ids, sampling_params(body, budget, limits), images=images)
    request = with_grammar(request, grammar)
    meta = Meta(new_id("chatcmpl"), server.options.model_name)
    if body.stream:
        feed = TokenFeed()
        feed.attach(await server.submit(request, session, "chat", meta.completion_id, feed.callback()))
        return _streaming(_chat_chunks(server, body, meta, feed, call))
    result = await server.generate(request, session, "chat", meta.completion_id)
    replies = _chat_replies(server, body, result)
    await _remember(server, call, result, replies)
    return _chat_body(server, body, meta, prompt_ids, result, replies)


def _chat_body(
    server: Front,
    body: ChatCompletionRequest,
    meta: Meta,
    prompt_ids: list[int],
    result: BatchResult,
    replies: list[_Reply],
) -> dict[str, Any]:
    choices = []
    for i, (gen, r) in enumerate(zip(result.generations, replies, strict=True)):
        lp = chat_logprobs(gen.token_ids, gen.logprobs, server.piece) if body.logprobs else None
        ids = list(gen.token_ids) if body.return_token_ids else None
        choices.append(chat_choice(i, r.content, r.calls, r.finish, lp, ids))
    out = {
        **meta.head("chat.completion"),
        "choices": choices,
        "system_fingerprint": None,
        "usage": usage([len(prompt_ids)], result.generations, _cached(result.generations)),
    }
    if body.return_token_ids:
        out["prompt_token_ids"] = prompt_ids
    return out


async def _chat_chunks(
    server: Front, body: ChatCompletionRequest, meta: Meta, feed: TokenFeed, call: _Chat
) -> Chunks:
    tools = _uses_tools(body)
    texts = [TextStream(server.decode, body.stop_strings()) for _ in range(body.n)]
    for i in range(body.n):
        yield chat_chunk(meta, i, {"role": "assistant", "content": ""})
    async for index, token_id, logprob in feed.events():
        delta = "" if tools else texts[index].push(token_id)
        lp = chat_logprobs([token_id], [logprob], server.piece) if body.logprobs else None
        if delta or lp:
            yield chat_chunk(meta, index, {"content": delta}, logprobs=lp)
    try:
        result = await result_of(feed.futures[0])
    except APIError as err:
        yield err.body()
        return
    replies = _chat_replies(server, body, result)
    await _remember(server, call, result, replies)
    for i, r in enumerate(replies):
        tail = r.content if tools else texts[i].finish()
        if tail:
            yield chat_chunk(meta, i, {"content": tail})
        if r.calls:
            yield chat_chunk(meta, i, {"tool_calls": [{"index": k, **c} for k, c in enumerate(r.calls)]})
        yield chat_chunk(meta, i, {}, finish_reason=r.finish)
    if _wants_usage(body):
        yield usage_chunk(
            meta,
            "chat.completion.chunk",
            usage([len(call.prompt_ids)], result.generations, _cached(result.generations)),
        )


# ---- completions -----------------------------------------------------------------------------------------


async def completions(server: Front, body: CompletionRequest, session: str) -> Any:
    check_model(server, body)
    limits = server.options.limits
    grammar = request_grammar(body.model_extra or {}, server.options.constrained_decoding)
    prompts = completion_prompts(server.tokenizer, body, limits)
    requests = [
        GenerationRequest(
            ids, sampling_params(body, token_budget(len(ids), body.max_tokens, limits, "prompt"), limits)
        )
        for ids in prompts
    ]
    requests = [with_grammar(r, grammar) for r in requests]
    meta = Meta(new_id("cmpl"), server.options.model_name)
    feed = TokenFeed() if body.stream else None
    futures = []
    for p, request in enumerate(requests):
        on_token = feed.callback(p * body.n) if feed is not None else None
        futures.append(
            await server.submit(request, session, "completions", meta.completion_id, on_token, p * body.n)
        )
    if feed is not None:
        for future in futures:
            feed.attach(future)
        return _streaming(_completion_chunks(server, body, meta, feed, prompts))
    results = [await result_of(f) for f in futures]
    return _completion_body(server, body, meta, prompts, results)


def _completion_body(
    server: Front, body: CompletionRequest, meta: Meta, prompts: list[list[int]], results: list[BatchResult]
) -> dict[str, Any]:
    choices, samples = [], [g for r in results for g in r.generations]
    for i, gen in enumerate(samples):
        text, _ = cut_at_stop(server.decode(gen.token_ids), body.stop_strings())
        lp = (
            completion_logprobs(gen.token_ids, gen.logprobs, server.piece)
            if body.logprobs is not None
            else None
        )
        ids = list(gen.token_ids) if body.return_token_ids else None
        choices.append(completion_choice(i, text, gen.finish_reason, lp, ids))
    out = {
        **meta.head("text_completion"),
        "choices": choices,
        "system_fingerprint": None,
        "usage": usage([len(p) for p in prompts], samples),
    }
    if body.return_token_ids:
        out["prompt_token_ids"] = prompts[0] if len(prompts) == 1 else prompts
    return out


def _text_chunk(
    meta: Meta, index: int, text: str, finish: str | None = None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    return {**meta.head("text_completion"), "choices": [choice]}


async def _completion_chunks(
    server: Front, body: CompletionRequest, meta: Meta, feed: TokenFeed, prompts: list[list[int]]
) -> Chunks:
    texts = [TextStream(server.decode, body.stop_strings()) for _ in range(len(prompts) * body.n)]
    async for index, token_id, logprob in feed.events():
        start = texts[index].sent
        delta = texts[index].push(token_id)
        lp = (
            completion_logprobs([token_id], [logprob], server.piece, start)
            if body.logprobs is not None
            else None
        )
        if delta or lp:
            yield _text_chunk(meta, index, delta, logprobs=lp)
    try:
        results = [await result_of(f) for f in feed.futures]
    except APIError as err:
        yield err.body()
        return
    samples = [g for r in results for g in r.generations]
    for i, gen in enumerate(samples):
        yield _text_chunk(meta, i, texts[i].finish(), gen.finish_reason)
    if _wants_usage(body):
        yield usage_chunk(meta, "text_completion", usage([len(p) for p in prompts], samples))
