"""Helpers for the HTTP server tests: a scripted engine whose replies are fixed functions of the prompt, a
server started on a free port for the length of a `with`, and the official OpenAI client pointed at it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import openai

from ascent.messages import Generation, GenerationRequest
from ascent.models.loading import load_tokenizer
from ascent.rollout.server import Limits, OpenAIServer, ServerOptions

KEY = "test-key"
EOS = 1  # the tiny tokenizer's <|im_end|>
Reply = Callable[[GenerationRequest], list[int]]


class ScriptedEngine:
    """A RolloutEngine that answers each request with `reply(request)` (the same for every sample), logprob
    -0.5 per token, after `delay_s` per call; `batches` holds the number of requests of every call."""

    def __init__(self, reply: Reply, delay_s: float = 0.0) -> None:
        self.reply, self.delay_s = reply, delay_s
        self.batches: list[int] = []
        self.weights: list[str] = []

    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        self.batches.append(len(requests))
        time.sleep(self.delay_s)
        return [[self._one(r, i) for i in range(r.params.n)] for r in requests]

    def _one(self, request: GenerationRequest, index: int) -> Generation:
        ids = self.reply(request)[: request.params.max_new_tokens]
        finish = "stop" if ids and ids[-1] == EOS else "length"
        return Generation(ids, [-0.5 - 0.01 * index] * len(ids), finish)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self.weights.extend(name for name, _ in named_tensors)

    def sleep(self, release_weights: bool = False) -> None: ...

    def wake(self) -> None: ...


class StreamingScriptedEngine(ScriptedEngine):
    """A ScriptedEngine that reports each token as it goes, `token_delay_s` apart (a real streaming
    engine)."""

    def __init__(self, reply: Reply, token_delay_s: float) -> None:
        super().__init__(reply)
        self.token_delay_s = token_delay_s
        self.finished = threading.Event()

    def generate_streaming(
        self, requests: list[GenerationRequest], on_token: Callable[[int, int, int, float], None]
    ) -> list[list[Generation]]:
        out = self.generate(requests)
        for pos, samples in enumerate(out):
            for index, gen in enumerate(samples):
                for token_id, logprob in zip(gen.token_ids, gen.logprobs, strict=True):
                    time.sleep(self.token_delay_s)
                    on_token(pos, index, token_id, logprob)
        self.finished.set()
        return out


class ShortFirstEngine(ScriptedEngine):
    """A live engine (as the fast engine's continuous batching): a call takes the requests that arrive within
    `gather_s` of its start, then answers them shortest reply first, so a short request finishes before a
    long one that started earlier."""

    def __init__(self, reply: Reply, gather_s: float) -> None:
        super().__init__(reply)
        self.gather_s = gather_s

    def generate_live(
        self,
        requests: list[GenerationRequest],
        more: Callable[[Callable[[GenerationRequest], bool]], list[GenerationRequest]],
        done: Callable[[int, list[Generation]], None],
    ) -> None:
        taken = list(requests)
        deadline = time.monotonic() + self.gather_s
        while time.monotonic() < deadline:
            taken += more(lambda _: True)
            time.sleep(0.01)
        self.batches.append(len(taken))
        for i in sorted(range(len(taken)), key=lambda i: len(self.reply(taken[i]))):
            done(i, [self._one(taken[i], n) for n in range(taken[i].params.n)])


def chat_user_text(request: GenerationRequest) -> list[int]:
    """The ids of the one user message of a tiny-template chat prompt: <|im_start|> u TEXT <|im_end|>
    <|im_start|> a."""
    return request.prompt_ids[2:-3]


API_PROCESSES = [1, 2]  # the server's HTTP work in its own process, and in two front-end processes


@contextlib.contextmanager
def serving(engine: Any, model_dir: Path, **options: Any) -> Iterator[OpenAIServer]:
    """An OpenAIServer on `engine` with the tokenizer of `model_dir`, on a free port, for the `with` body
    (`api_processes=2`: its HTTP work in two front-end processes, the engine in this one)."""
    tokenizer = load_tokenizer(model_dir)
    limits = Limits(options.pop("max_model_len", 512), len(tokenizer), options.pop("default_max_tokens", 16))
    server = OpenAIServer(
        engine, tokenizer, ServerOptions("tiny", limits, options.pop("api_key", KEY), **options)
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def client(server: OpenAIServer, key: str = KEY, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=30, **kwargs)


def async_client(server: OpenAIServer, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=60)
