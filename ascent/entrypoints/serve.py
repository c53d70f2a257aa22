"""`ascent serve --model DIR`: the policy behind an OpenAI-compatible HTTP API (`ascent.rollout.server`).

It loads the checkpoint into the fast engine on a GPU or the reference engine on a CPU (`--engine`),
wraps it in an `OpenAIServer` (its HTTP work in `--api-processes` front-end processes) and serves
`/v1/chat/completions`, `/v1/completions`, `/v1/models` and `/health` until SIGTERM or Ctrl-C (exit 143 / 130
after a graceful shutdown). An API key is required (`--api-key` or ASCENT_API_KEY) unless `--no-api-key` is
given, which is allowed only on a loopback address. `--record DIR` writes every returned sample to the
experience store `DIR/experience.db` (`serve_record.py`); `--tool-parser` names the format replies' tool
calls are read in (default: from the chat template). `ascent.cli` registers `serve_command` as the command;
heavy imports wait until it runs.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from ascent.entrypoints.guard import ErrorGuard, ServeError
from ascent.entrypoints.serve_options import (
    ApiKeyOpt,
    ApiProcessesOpt,
    DeviceOpt,
    DtypeOpt,
    EngineOpt,
    GpuMemoryFractionOpt,
    HostOpt,
    LogLevelOpt,
    MaxBatchSizeOpt,
    MaxModelLenOpt,
    MaxTokensOpt,
    ModelOpt,
    NoApiKeyOpt,
    PauseTimeoutOpt,
    PortOpt,
    RecordOpt,
    ServedModelNameOpt,
    TemperatureOpt,
    ToolParserOpt,
    TopKOpt,
    TopPOpt,
    TrustRemoteCodeOpt,
)

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
ENGINES = ("auto", "reference", "fast")
DTYPES = ("auto", "fp32", "bf16", "fp16")


class _Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def serve_command(
    model: ModelOpt,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    api_key: ApiKeyOpt = None,
    no_api_key: NoApiKeyOpt = False,
    served_model_name: ServedModelNameOpt = None,
    engine: EngineOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    max_batch_size: MaxBatchSizeOpt = 64,
    max_model_len: MaxModelLenOpt = None,
    gpu_memory_fraction: GpuMemoryFractionOpt = 0.85,
    max_tokens: MaxTokensOpt = 256,
    temperature: TemperatureOpt = 1.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    pause_timeout: PauseTimeoutOpt = 30.0,
    trust_remote_code: TrustRemoteCodeOpt = False,
    log_level: LogLevelOpt = "info",
    record: RecordOpt = None,
    tool_parser: ToolParserOpt = "auto",
    api_processes: ApiProcessesOpt = "auto",
) -> None:
    """Serve a checkpoint over an OpenAI-compatible API (chat, completions, tools, streaming).

    Example: ascent serve --model models/Qwen2.5-0.5B-Instruct --port 8000 --api-key secret
    """
    from ascent.rollout.server.tool_parsers import TOOL_PARSERS  # here: it imports torch

    with ErrorGuard():
        settings = ServeSettings(
            model=model,
            api_key=check_access(host, api_key, no_api_key),
            served_model_name=served_model_name,
            engine=_choose("--engine", engine, ENGINES),
            device=device,
            dtype=_choose("--dtype", dtype, DTYPES),
            max_batch_size=max_batch_size,
            max_model_len=max_model_len,
            gpu_memory_fraction=gpu_memory_fraction,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            pause_timeout=pause_timeout,
            trust_remote_code=trust_remote_code,
            api_processes=parse_api_processes(api_processes),
            record=record,
            tool_parser=_choose("--tool-parser", tool_parser, ("auto", *TOOL_PARSERS)),
        )
        server = build_server(settings)
        sink = attach_record(server, settings)
        previous = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            serve(server, host, port, log_level)
        except _Stopped as stop:
            typer.echo(f"ascent serve: stopped by {stop}.", err=True)
            raise typer.Exit(128 + stop.signum) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if sink is not None:
                sink.close()


def serve(server: Any, host: str, port: int, log_level: str) -> None:
    """Run `server` in the foreground; an address that cannot be bound is the user's to fix."""

    def bound(url: str) -> None:
        procs = server.options.api_processes
        http = f"; HTTP in {procs} front-end processes" if procs > 1 else ""
        typer.echo(
            f"serving {server.options.model_name} at {url} (policy version {server.policy_version}{http})"
        )

    try:
        server.run(host, port, log_level, on_bound=bound)
    except OSError as err:
        if err.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise ServeError(
            f"--host {host} --port {port}: cannot listen there ({err.strerror}); choose another "
            "--port (0 picks a free one) or --host."
        ) from err


def _raise_stopped(signum: int, frame: Any) -> None:
    raise _Stopped(signum)


def _choose(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ServeError(f"{option} {value}: unknown; use one of {', '.join(choices)}.")
    return value


def parse_api_processes(value: str) -> int | None:
    """--api-processes: a count of 1 or more, or auto (None: decided once the device is known)."""
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        raise ServeError(f"--api-processes {value}: use a number of processes (1 or more) or auto.")
    return int(value)


def auto_api_processes(device_type: str) -> int:
    """min(8, CPUs/2) front ends beside a GPU engine (the rest of the CPUs feed the GPU); 1 on CPU, where
    the engine itself needs the cores."""
    if device_type != "cuda":
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus // 2))


def check_access(host: str, api_key: str | None, no_api_key: bool) -> str | None:
    """The key to require (None: none), or a ServeError naming the option to set."""
    if api_key and no_api_key:
        raise ServeError("--api-key and --no-api-key: choose one (ASCENT_API_KEY counts as --api-key).")
    if no_api_key:
        if host not in LOOPBACK:
            raise ServeError(
                f"--no-api-key with --host {host}: a server without a key may only listen on a loopback "
                f"address ({', '.join(sorted(LOOPBACK))}); set --api-key (or ASCENT_API_KEY) to serve on "
                f"{host}."
            )
        return None
    if not api_key:
        raise ServeError(
            "--api-key is not set: clients must send a key (set --api-key KEY or ASCENT_API_KEY), or serve "
            "without one on localhost with --no-api-key."
        )
    return api_key


@dataclass(frozen=True)
class ServeSettings:
    """What `ascent serve` was asked for, checked: the model, access, engine and sampling defaults."""

    model: str
    api_key: str | None
    served_model_name: str | None = None
    engine: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 64
    max_model_len: int | None = None
    gpu_memory_fraction: float = 0.85
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    pause_timeout: float = 30.0
    trust_remote_code: bool = False
    api_processes: int | None = None  # HTTP front-end processes; None: auto_api_processes
    record: str | None = None  # a directory for the experience store of what is served
    tool_parser: str = "auto"


def build_server(s: ServeSettings) -> Any:
    """Load the tokenizer, the model's limits and the engine; an OpenAIServer around them."""
    # deferred: torch; `ascent.cli` imports this module
    from ascent.data import image_codec  # deferred: ascent.data imports torch
    from ascent.models.loading import auto_dtype, load_tokenizer, resolve_device  # deferred: torch
    from ascent.rollout import build_engine  # deferred: torch
    from ascent.rollout.server import Limits, OpenAIServer, ServerOptions  # deferred: torch, fastapi

    tokenizer = load_tokenizer(s.model, trust_remote_code=s.trust_remote_code)
    length, vocab = model_limits(s.model, s.max_model_len, s.trust_remote_code)
    dev = resolve_device(s.device)
    name = s.engine if s.engine != "auto" else ("fast" if dev.type == "cuda" else "reference")
    dtype = s.dtype if s.dtype != "auto" else auto_dtype(dev)
    kwargs: dict[str, Any] = {
        "model_path": s.model,
        "dtype": dtype,
        "device": dev,
        "trust_remote_code": s.trust_remote_code,
    }
    if name == "fast":
        kwargs |= {
            "max_batch_size": s.max_batch_size,
            "max_model_len": length,
            "gpu_memory_fraction": s.gpu_memory_fraction,
        }
    else:
        kwargs |= {"generation_batch_size": s.max_batch_size}
    limits = Limits(length, max(vocab, len(tokenizer)), s.max_tokens, s.temperature, s.top_p, s.top_k)
    api_processes = s.api_processes or auto_api_processes(dev.type)
    options = ServerOptions(
        s.served_model_name or Path(s.model).resolve().name,
        limits,
        s.api_key,
        max_batch_requests=s.max_batch_size,
        pause_timeout_s=s.pause_timeout,
        api_processes=api_processes,
        tool_parser=s.tool_parser,
    )
    codec = image_codec(s.model)  # a vision-language model's: the endpoint takes image content parts
    return OpenAIServer(build_engine(name, **kwargs), tokenizer, options, codec=codec)


def attach_record(server: Any, s: ServeSettings) -> Any:
    """With --record: a RecordSink on the server's recorder (close it after serving); else None."""
    if s.record is None:
        return None
    from ascent.entrypoints.serve_record import RecordSink  # deferred: torch (transport, rollout.server)

    sink = RecordSink(s.record, s.model, lambda ids: server.decode(list(ids)))
    server.recorder.sink = sink
    return sink


def model_limits(model: str, max_model_len: int | None, trust_remote_code: bool = False) -> tuple[int, int]:
    """(context length, vocab size): --max-model-len, at most the config's max_position_embeddings."""
    from transformers import AutoConfig  # deferred: transformers, slow to import

    config = AutoConfig.from_pretrained(model, local_files_only=True, trust_remote_code=trust_remote_code)
    config = getattr(config, "text_config", None) or config
    context = getattr(config, "max_position_embeddings", None)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if context and max_model_len and max_model_len > context:
        raise ServeError(
            f"--max-model-len {max_model_len}: over the model's max_position_embeddings ({context}); "
            f"set it to {context} or less."
        )
    if not (max_model_len or context):
        raise ServeError(f"--model {model}: config.json has no max_position_embeddings; set --max-model-len.")
    return int(max_model_len or context or 0), vocab
