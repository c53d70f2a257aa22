"""Request bodies of the OpenAI-compatible endpoints (`ascent.rollout.server`), as pydantic models.

FastAPI validates every body against these, so a wrong type or value is a 400 naming its field (reshaped
by `errors.validation_error`). Nothing a request asks for is silently dropped: fields the engine cannot
honour (penalties, top-k alternatives, forced tool choice, `parallel_tool_calls: false`, vLLM's grammar
options but the four in `GRAMMAR_FIELDS`, which `grammar.py` honours or refuses) and fields this server
does not know are refused by name (`refused_field`, checked by the handlers), except the few in
`INFORMATIONAL` that change no token (`user`, `metadata`, ...).
`top_k`, `min_p`, `repetition_penalty` and `return_token_ids` are vLLM-style extensions (the `extra_body`
of the official client). Nested objects (messages, tools) ignore fields they do not use, so a client can
send back the assistant message it received (with its `refusal`, `annotations`, ...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

MAX_N = 128  # samples per request
MAX_STOP = 4


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageUrl(_Body):
    url: str  # a data URL (data:image/png;base64,...) or an absolute path; http(s) URLs are refused
    detail: Literal["auto"] | None = None  # the server's pixel budget decides an image's tokens


class ImageUrlPart(_Body):
    """OpenAI's image part; read by `ascent.models.content` (for a vision-language model only)."""

    type: Literal["image_url"]
    image_url: ImageUrl


class ImagePart(_Body):
    """Hugging Face's image part: `image` is a data URL or an absolute path."""

    type: Literal["image"]
    image: str


ContentPart = Annotated[TextPart | ImageUrlPart | ImagePart, Field(discriminator="type")]


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (only assistant tool calls may omit it)")
        return self


class FunctionDef(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Body):
    include_usage: bool = False


_SAMPLED_ONLY = "the engine records only the sampled token's logprob, not alternatives; set it to 0"
UNSUPPORTED = {  # fields the engine cannot honour -> what to do instead
    "presence_penalty": "leave it at 0 (repetition_penalty is supported)",
    "frequency_penalty": "leave it at 0 (repetition_penalty is supported)",
    "logit_bias": "leave it out",
    "top_logprobs": _SAMPLED_ONLY,
    # completions: an int, the number of alternatives; 0 returns tokens, token_logprobs and text_offset
    "logprobs": "the engine records only the sampled token's logprob, not alternatives; set it to 0 to get "
    "each sampled token's logprob (tokens, token_logprobs, text_offset; top_logprobs is null)",
    "echo": "leave it out",
    "suffix": "leave it out",
}


_NO_GRAMMAR = (
    "this server constrains decoding only with response_format, guided_json, guided_regex or guided_choice; "
    "leave it out"
)
_TEXT_ONLY = "this server generates text only; leave it out"
GRAMMAR_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice")  # grammar.py reads them
# fields set to anything but their harmless value (None always is) -> what to do instead
REFUSED_EXTRAS: dict[str, tuple[Any, str]] = {
    "parallel_tool_calls": (
        True,
        "the model may write several calls in one reply and the server cannot "
        "stop it; leave it out or set it to true",
    ),
    "functions": ([], "the legacy functions API is not supported; send them as tools"),
    "function_call": ("none", "the legacy functions API is not supported; use tools and tool_choice"),
    "modalities": (["text"], _TEXT_ONLY),
    "audio": (None, _TEXT_ONLY),
    "prediction": (None, "predicted outputs are not supported; leave it out"),
    "web_search_options": (None, "web search is not supported; leave it out"),
    "reasoning_effort": (None, "the server does not steer reasoning; leave it out"),
    "verbosity": (None, "the server does not steer verbosity; leave it out"),
    "logits_processors": (None, "custom logits processors are not supported; leave it out"),
    **{
        name: (None, _NO_GRAMMAR)
        for name in (
            "guided_grammar",
            "guided_decoding_backend",
            "guided_whitespace_pattern",
            "structured_outputs",
        )
    },
}
# accepted and ignored: they describe the caller or ask for bookkeeping, and change no token
INFORMATIONAL = frozenset(
    {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
)


def refused_field(body: SamplingBody) -> tuple[str, str] | None:
    """(field, message) for the first field of `body` this server does not take (see the module doc)."""
    for name, value in (body.model_extra or {}).items():
        if name in INFORMATIONAL or name in GRAMMAR_FIELDS:
            continue
        if name in REFUSED_EXTRAS:
            harmless, fix = REFUSED_EXTRAS[name]
            if value is None or value == harmless:
                continue
            return name, f"{name}={value!r} is not supported by this server; {fix}."
        known = ", ".join(sorted(type(body).model_fields))
        return name, f"{name}: unknown parameter for this endpoint; it accepts {known}."
    return None


def refuse(value: Any, info: ValidationInfo) -> Any:
    """For field validators: a value that is set (not 0, empty or false) is refused, naming the way out."""
    if value:
        name = str(info.field_name)
        raise ValueError(f"{name}={value!r} is not supported by this server; {UNSUPPORTED[name]}")
    return value


class SamplingBody(_Body):
    """What both endpoints share: the model, sampling, stopping, seeding, streaming. Fields it does not
    declare are kept in `model_extra` for `refused_field`."""

    model_config = ConfigDict(extra="allow")
    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"give at most {MAX_STOP} non-empty stop strings")
        return value

    @field_validator("presence_penalty", "frequency_penalty", "logit_bias")
    @classmethod
    def _unsupported_sampling(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse(value, info)

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatCompletionRequest(SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _unsupported_chat(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse(value, info)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none", "auto"):
            raise ValueError(
                "only 'auto' and 'none' are supported: the model is not constrained to call a tool"
            )
        return value

    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("logprobs", "echo", "suffix")
    @classmethod
    def _unsupported_completion(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse(value, info)

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("best_of is not supported by this server; use n")
        return value

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if value in ("", []) or (isinstance(value, list) and any(p in ("", []) for p in value)):
            raise ValueError("a prompt must not be empty")
        return value
