"""The OpenAI-compatible HTTP server of the rollout engines (design: "Agents written against the OpenAI API
can be trained too"; `ascent serve` is its command, in `ascent.entrypoints.serve`).

Map: `schemas` (request bodies) -> `prepare` (prompts, context limit, sampling params) -> `server`
(`OpenAIServer`: lifecycle, pausing for weight updates, recording) -> `batcher` (the engine's own thread,
batching concurrent requests) -> the engine; back through `handlers` (chat and completions bodies),
`responses` (OpenAI shapes), `streaming` (tokens to SSE) and `chat` (messages and tool calls, read by the
family's parser in `tool_parsers`). `grammar` turns `response_format` and guided decoding into llguidance
grammars the reference engine samples under. `recorder` keeps every sample token-exact per session for
training (and hands each to a sink: `ascent serve --record`); `errors` gives every failure OpenAI's shape;
`app` is the FastAPI wiring; `options` holds `ServerOptions`. FastAPI and uvicorn are imported only by this
package.

The handlers talk to the engine through `front.Front`. With `ServerOptions.api_processes` > 1 they run in
front-end processes (`frontend`, kept running by `pool`), which send token ids and sampling params over
`ipc` channels to the `hub` in the engine's process; the recorder and the threads stay there.
"""

from typing import TYPE_CHECKING, Any

from ascent.rollout.server.batcher import Batcher, BatchResult, EnginePaused, StreamingEngine
from ascent.rollout.server.options import ServerOptions
from ascent.rollout.server.prepare import Limits
from ascent.rollout.server.recorder import CompletionRecord, Recorder

if TYPE_CHECKING:
    from ascent.rollout.server.server import OpenAIServer


def __getattr__(name: str) -> Any:
    """`OpenAIServer` on first use (PEP 562): it imports FastAPI and uvicorn, which a run that only records
    or limits completions (the loop's agent collector at import time) need not load."""
    if name == "OpenAIServer":
        from ascent.rollout.server.server import OpenAIServer  # deferred: FastAPI, uvicorn

        return OpenAIServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchResult",
    "Batcher",
    "CompletionRecord",
    "EnginePaused",
    "Limits",
    "OpenAIServer",
    "Recorder",
    "ServerOptions",
    "StreamingEngine",
]
