"""`EngineSpec`: what one rollout engine replica is built from (the rollout worker's spec).

Setup turns the config into it once (`ascent.orchestrator.specs.engine_spec`); the rollout worker resolves
its device, loads the tokenizer and hands `builder_kwargs()` to the engine's builder
(`ascent.rollout.ENGINES`). A frozen dataclass, so it pickles to Ray actors; nothing in `ascent.rollout`
reads a config section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ascent.models.action_head import ActionHeadSpec


@dataclass(frozen=True)
class EngineSpec:
    """One engine replica: `name` picks the builder (`reference` or `fast`).

    Settings one engine has and the other lacks are None where they do not apply: `generation_batch_size`
    (reference), `gpu_memory_fraction`, `on_swap`, `tensor_parallel`, `prefix_caching`, `batch_invariant`,
    `shared_prefix` and `quantization` (fast). `options` are more keywords of the builder (tests and benchmarks size the fast
    engine's pages and batch with them; setup passes none).
    """

    name: str
    model_path: str
    tokenizer_path: str
    dtype: str = "fp32"
    device: str = "auto"
    trust_remote_code: bool = False
    generation_batch_size: int | None = None
    gpu_memory_fraction: float | None = None
    on_swap: str | None = None
    tensor_parallel: int | None = None  # fast: ranks (GPUs of a node) one replica spans
    prefix_caching: bool | None = None  # fast: reuse full prompt pages across requests (prefix.py)
    batch_invariant: bool | None = None  # fast: a request's samples independent of its batch (runner.py)
    shared_prefix: bool | None = None  # fast: groups of rows read their shared pages once (triton_cascade.py)
    quantization: str | None = None  # fast: "fp8" holds the layers' linear weights in FP8 (fast/fp8.py)
    action_head: ActionHeadSpec | None = None  # act with a continuous action head (either engine)
    options: dict[str, Any] = field(default_factory=dict)

    def builder_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the engine's builder (device as given: the worker resolves it; no tokenizer:
        the worker loads it and passes its EOS, pad and decode)."""
        kw: dict[str, Any] = {
            "model_path": self.model_path,
            "dtype": self.dtype,
            "device": self.device,
            "trust_remote_code": self.trust_remote_code,
        }
        optional = {
            "generation_batch_size": self.generation_batch_size,
            "gpu_memory_fraction": self.gpu_memory_fraction,
            "on_swap": self.on_swap,
            "tensor_parallel": self.tensor_parallel,
            "prefix_caching": self.prefix_caching,
            "batch_invariant": self.batch_invariant,
            "quantization": self.quantization,
            "action_head": self.action_head,
        }
        options = dict(self.options)
        # None: the engine's default; an attn_options entry of `options` wins
        if self.shared_prefix is not None:
            options["attn_options"] = {"shared_prefix": self.shared_prefix} | options.get("attn_options", {})
        return kw | {k: v for k, v in optional.items() if v is not None} | options
