"""The options of `ascent serve` (`ascent.entrypoints.serve.serve_command`), one named type per option."""

from __future__ import annotations

from typing import Annotated

import typer

ModelOpt = Annotated[str, typer.Option(help="Local Hugging Face checkpoint directory.", show_default=False)]
HostOpt = Annotated[str, typer.Option(help="Address to bind.")]
PortOpt = Annotated[int, typer.Option(min=0, max=65535, help="Port to bind (0: a free one).")]
ApiKeyOpt = Annotated[
    str | None, typer.Option(envvar="ASCENT_API_KEY", help="Key clients must send as a Bearer token.")
]
NoApiKeyOpt = Annotated[
    bool, typer.Option("--no-api-key", help="Serve without a key (only on 127.0.0.1/localhost/::1).")
]
ServedModelNameOpt = Annotated[
    str | None, typer.Option(help="Model id clients ask for (default: the directory name).")
]
EngineOpt = Annotated[str, typer.Option(help="auto (fast on a GPU, reference on CPU), reference or fast.")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str, typer.Option(help="auto (bf16 on a GPU, fp32 on CPU), fp32, bf16 or fp16.")]
MaxBatchSizeOpt = Annotated[int, typer.Option(min=1, help="Most sequences the engine decodes together.")]
MaxModelLenOpt = Annotated[
    int | None, typer.Option(min=1, help="Context length (default: the model's max_position_embeddings).")
]
GpuMemoryFractionOpt = Annotated[
    float,
    typer.Option(min=0.05, max=0.99, help="Fast engine: share of GPU memory for weights and KV cache."),
]
MaxTokensOpt = Annotated[int, typer.Option(min=1, help="Response tokens when a request gives no max_tokens.")]
TemperatureOpt = Annotated[float, typer.Option(min=0.0, help="Default temperature (0: greedy).")]
TopPOpt = Annotated[float, typer.Option(min=0.0, max=1.0, help="Default top-p.")]
TopKOpt = Annotated[int, typer.Option(min=0, help="Default top-k (0: off).")]
PauseTimeoutOpt = Annotated[
    float, typer.Option(min=0.0, help="Seconds a request waits out a weight update before a 503.")
]
TrustRemoteCodeOpt = Annotated[bool, typer.Option(help="Let the checkpoint run its own code.")]
LogLevelOpt = Annotated[str, typer.Option(help="uvicorn's log level: debug, info, warning, error.")]
RecordOpt = Annotated[
    str | None,
    typer.Option(
        help="Write every returned sample to DIR/experience.db (status served), which `ascent episodes "
        "DIR` and the studio read.",
        metavar="DIR",
        show_default=False,
    ),
]
ToolParserOpt = Annotated[
    str,
    typer.Option(
        help="How replies' tool calls are read: auto (from the chat template), hermes (Qwen's "
        "<tool_call>), llama3_json or mistral."
    ),
]
ApiProcessesOpt = Annotated[
    str,
    typer.Option(
        help="HTTP front-end processes sharing the port, each parsing, templating, tokenizing and "
        "writing responses, feeding the engine's process token ids (1: all in one process). "
        "auto: min(8, CPUs/2) on a GPU, 1 on CPU (on an H200, 8 front ends gave 0.86 of the engine's "
        "direct throughput against 0.78 with 1: BENCHMARKS.md)."
    ),
]
