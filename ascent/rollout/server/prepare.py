"""Request bodies -> engine requests, within the model's limits (`ascent.rollout.server`).

Prompts are rendered (chat: the tokenizer's chat template with `tools=`; completions: text encoded as the
tokenizer does by default, or token ids taken as given) and checked against the context: prompt tokens
plus `max_tokens` over the model's `max_model_len` is a 400 naming the limit, as OpenAI answers
(`context_length_exceeded`). Without `max_tokens` a request gets the server's default, cut to what the
context leaves. Sampling fields the request leaves out take the server's defaults.

Image content parts (`ascent.models.content`, the parser dataset rows use: data URLs or absolute paths;
http(s) URLs refused) are decoded and encoded by a vision-language model's `ImageCodec`; the prompt's image
placeholders become each image's tokens, and its prompt tokens count them. A text model answers a 400.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ascent.messages import GenerationRequest, ImageInput, SamplingParams
from ascent.models import content
from ascent.models.vision import ImageCodec
from ascent.rollout.server.chat import template_messages, template_tools
from ascent.rollout.server.errors import APIError, bad_request
from ascent.rollout.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingBody


@dataclass(frozen=True)
class Limits:
    """The server's limits and defaults: context length, vocabulary, sampling defaults."""

    max_model_len: int
    vocab_size: int
    default_max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


def token_budget(prompt_len: int, max_tokens: int | None, limits: Limits, prompt_param: str) -> int:
    """The response's token budget; a 400 naming the limit when prompt + max_tokens does not fit."""
    room = limits.max_model_len - prompt_len
    if max_tokens is None and room >= 1:
        return min(limits.default_max_tokens, room)
    if max_tokens is not None and max_tokens <= room:
        return max_tokens
    head = f"This model's maximum context length is {limits.max_model_len} tokens. However, "
    if max_tokens is not None and room >= 1:
        message = (
            f"you requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} "
            "for the completion). Please reduce the length of the prompt or max_tokens."
        )
    else:
        message = (
            f"the prompt has {prompt_len} tokens, which leaves no room for a completion. Please shorten it."
        )
    param = "max_tokens" if room >= 1 else prompt_param
    raise APIError(400, head + message, param=param, code="context_length_exceeded")


def sampling_params(body: SamplingBody, max_new_tokens: int, limits: Limits) -> SamplingParams:
    top_k = limits.top_k if body.top_k is None else max(body.top_k, 0)  # vLLM's -1 = off
    return SamplingParams(
        temperature=limits.temperature if body.temperature is None else body.temperature,
        top_p=limits.top_p if body.top_p is None else body.top_p,
        top_k=top_k,
        min_p=body.min_p or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        max_new_tokens=max_new_tokens,
        stop_strings=body.stop_strings(),
        n=body.n,
        seed=body.seed,
    )


def with_grammar(request: GenerationRequest, grammar: str | None) -> GenerationRequest:
    """`request` sampling under `grammar` (`grammar.request_grammar`; None: as it is)."""
    return request if grammar is None else replace(request, params=replace(request.params, grammar=grammar))


def chat_inputs(body: ChatCompletionRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The request's messages and tools as the chat template reads them (tools None with tool_choice none)."""
    tools = template_tools(body.tools) if body.tool_choice != "none" else None
    return template_messages(body.messages), tools


def chat_images(
    messages: list[dict[str, Any]], codec: ImageCodec | None
) -> tuple[list[dict[str, Any]], tuple[ImageInput, ...]]:
    """Template messages that show images -> (the messages with the template's image placeholders, the
    images encoded by `codec`, in order); messages without images come back as they are. A 400 for images
    sent to a text model (`codec` None) and for an image that is refused or cannot be read."""
    if not content.has_images(messages):
        return messages, ()
    if codec is None:
        raise bad_request(
            "messages: this model reads no images (a text-only model); send text only, or serve a "
            "vision-language model (Qwen2.5-VL, Qwen3-VL).",
            "messages",
        )
    try:
        template, refs = content.template_messages(messages)
        return template, tuple(codec.encode(content.open_image(r), r.source) for r in refs)
    except (content.ContentError, content.ImageLoadError) as err:
        raise bad_request(f"messages: {err}.", "messages") from err
    except ValueError as err:  # the codec's ImageCodecError: pixels it cannot take
        raise bad_request(f"messages: an image cannot be encoded: {err}.", "messages") from err


def expand_images(
    prompt_ids: list[int], images: tuple[ImageInput, ...], codec: ImageCodec | None
) -> list[int]:
    """The prompt with each image's placeholder repeated to its token count (a 400 if the text itself
    writes the image token, so placeholders and images do not pair up)."""
    if not images or codec is None:  # no images (chat_images refused them for a text model)
        return prompt_ids
    try:
        return list(codec.expand(prompt_ids, images))
    except ValueError as err:
        raise bad_request(
            f"messages: {err}; the text must not hold the image token itself.", "messages"
        ) from err


def chat_prompt(chat: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The conversation rendered with the chat template and its generation prompt, as token ids."""
    try:
        return list(chat.prompt_ids(messages, tools=tools))
    except Exception as err:  # jinja's TemplateError and friends: the messages do not fit the template
        raise bad_request(f"messages: the model's chat template refused them: {err}", "messages") from err


def completion_prompts(tokenizer: Any, body: CompletionRequest, limits: Limits) -> list[list[int]]:
    """One list of token ids per prompt of the request (a string, strings, ids, or lists of ids)."""
    prompt = body.prompt
    items: list[Any] = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else list(prompt)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.append(list(tokenizer.encode(item)))
            continue
        bad = next((t for t in item if not 0 <= t < limits.vocab_size), None)
        if bad is not None:
            param = "prompt" if len(items) == 1 and items[0] is prompt else f"prompt[{i}]"
            raise bad_request(
                f"{param}: token id {bad} is outside the vocabulary [0, {limits.vocab_size}).", param
            )
        out.append(list(item))
    if any(not ids for ids in out):
        raise bad_request("prompt: a prompt encodes to no tokens.", "prompt")
    return out
