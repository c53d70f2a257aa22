"""`ServerOptions`, how the OpenAI-compatible server answers, and the uvicorn settings every process of it
uses. A module of its own below `server` and `frontend`, so the server and the front ends it starts do not
import each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascent.rollout.server.prepare import Limits


@dataclass(frozen=True)
class ServerOptions:
    """How the server answers. `api_key=None` accepts any caller (bind to localhost only: `ascent serve`
    refuses anything else); `limits` holds the context length and sampling defaults; `api_processes` is the
    number of HTTP front-end processes (1: the HTTP work runs in the engine's own process)."""

    model_name: str
    limits: Limits
    api_key: str | None
    max_batch_requests: int = 256
    pause_timeout_s: float = 30.0  # how long a request waits for a weight update before a 503
    retry_after_s: int = 5
    max_records: int = 100_000
    any_model: bool = False  # answer whatever model name a call asks for (a training run's own endpoint)
    api_processes: int = 1
    tool_parser: str = "auto"  # a name in tool_parsers.TOOL_PARSERS; auto: from the chat template's markers
    constrained_decoding: bool = False  # set by OpenAIServer: its engine takes grammars (grammar.py)


def uvicorn_config(app: Any, host: str, log_level: str) -> Any:
    import uvicorn  # deferred: only a process that serves HTTP needs it

    return uvicorn.Config(
        app, host=host, log_level=log_level, timeout_graceful_shutdown=5, access_log=log_level == "debug"
    )
