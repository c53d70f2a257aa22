"""The `rollout` section of the run configuration: engines, sampling, staleness, the episode source
(`rollout.source`, a union of its own in sources.py) and where environments run.

Kept apart from schema.py (which re-exports it) for size only; the same rules hold: no torch, every field
with a default and a description.
"""

from __future__ import annotations

from typing import Any, Literal

import llguidance
from pydantic import Field, field_validator, model_validator

from ascent.config.errors import rule_error
from ascent.config.section import Section
from ascent.config.sources import (
    DEFAULT_SOURCE,
    PromptSourceConfig,
    Source,
    legacy_problem,
    source_problems,
)


class RolloutConfig(Section):
    engine: str = Field(
        "reference", description="Rollout engine: `reference` (transformers) or `fast` (GPU)."
    )
    tensor_parallel: int = Field(
        1,
        ge=1,
        description="Ranks (GPUs of one node) that each fast-engine replica spans, heads and MLP (every "
        "expert of a mixture of experts) split over them (tensor parallelism): the replica's worker starts "
        "the other ranks as child processes; cluster.num_rollout_workers x tensor_parallel GPUs in all "
        "(`ascent doctor` shows the placement).",
    )
    prefix_caching: bool = Field(
        False,
        description="rollout.engine=fast: prompts of different requests that share a prefix (a system "
        "prompt, few-shot examples) reuse the K/V of its full KV pages instead of prefilling it again; a "
        "prompt that continues pages another prompt of the same admission computes waits for that prefill "
        "(one more prefill pass), so a prefix shared by a batch is prefilled once. Unused cached pages are "
        "evicted least recently used first under memory pressure; a weight publication or sleep drops them "
        "all, so in synchronous RL the reuse happens within an iteration (eval and `ascent serve` keep it "
        "longer). Off by default: a reused prefix rounds differently from a full prefill (logprobs move in "
        "the last bits; tokens may differ at near-ties), so recorded runs replay bit for bit only without "
        "it. Reported as `rollout/prefix_reused_tokens`.",
    )
    shared_prefix_attention: bool | None = Field(
        None,
        description="rollout.engine=fast, Triton attention: rows that share full KV pages (the n samples of "
        "a prompt, prefix-cache hits) form groups of up to 8, and one kernel reads a group's shared pages "
        "once for all its rows instead of once per row (triton_cascade.py). Measured on an H200 at 256 "
        "rows of 512-token prompts: the 1.5B decode step 9% shorter, 0.5B 4% (BENCHMARKS.md). Unset: "
        "on wherever it applies (the Triton attention, not rollout.batch_invariant); false: every row reads "
        "its own pages, which moves bf16 logprobs by an ulp of the attention sum (tokens may differ at "
        "near-ties).",
    )
    batch_invariant: bool = Field(
        False,
        description="rollout.engine=fast: a request's tokens and logprobs do not depend on what else is "
        "batched with it (a seeded request samples bitwise what it samples alone). Every prefill and "
        "decode row runs alone (batch size 1, no padding: matmul kernels are chosen by shape), decode "
        "attention reads a fixed max_model_len, torch attention and sampler, no CUDA graphs, no "
        "torch.compile, no prompt feeding, no prefix caching. Cost: decode runs rows x layers small "
        "launches per step (16 rows of a tiny model: ~5x slower on CPU; on a GPU batching is lost "
        "altogether, not measured). Not built on GPU: "
        "batch-invariant Triton decode/prefill kernels (fixed split sizes) and batch-invariant matmuls "
        "(fixed tiles, no split-K), which would keep batching; so the mode is for debugging and "
        "reproducibility, not throughput, and not with rollout.tensor_parallel > 1. A session's next "
        "turn reuses its cached prefix when it is still cached: under memory pressure from other "
        "requests it may be evicted and recomputed, which rounds differently. Unseeded requests draw a "
        "fresh seed each: only seeded (or greedy) requests repeat.",
    )
    quantization: Literal["none", "fp8"] = Field(
        "none",
        description="rollout.engine=fast: `fp8` holds the engine's attention and MLP weight matrices in "
        "float8_e4m3fn with one scale per output channel, quantised on the engine as each publication "
        "arrives (the trainer keeps its full-precision weights; embeddings, norms and the LM head stay "
        "unquantised), and quantises activations per token: FP8 matmuls on GPUs with compute capability "
        "8.9+ (refused on older GPUs), an emulation on CPU. The engine samples and scores with the FP8 "
        "weights, so the sampler/trainer gap (`rollout/logprob_diff_mean|max`) grows; correct it with "
        "algorithm.rollout_correction=tis (its `rollout_is_weight_mean`, `rollout_is_clipped_frac`). Not "
        "with mixture-of-experts models or model.lora.publish=adapter.",
    )
    prompts_per_step: int = Field(8, gt=0, description="Prompts sampled per iteration.")
    samples_per_prompt: int = Field(
        8, gt=0, description="Trajectories generated per prompt (the group size)."
    )
    max_new_tokens: int = Field(256, gt=0, description="Most tokens generated per response.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")
    min_p: float = Field(0.0, ge=0, lt=1, description="Drop tokens below min_p times the top probability.")
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="Divide positive (multiply negative) logits of tokens already in the prompt or "
        "response by "
        "this; 1.0 is off. The sampler's logprobs are of the penalised distribution, so keep it at 1.0 when "
        "the trainer's logprobs must match the sampler's.",
    )
    stop_token_ids: list[int] = Field(default_factory=list, description="Extra stop tokens besides EOS.")
    stop_strings: list[str] = Field(
        default_factory=list, description="Stop when the response ends with these."
    )
    action_token_ids: list[int] = Field(
        default_factory=list,
        description="A VLA's action tokens (e.g. the ids of `<a0>`..`<a15>`): when set, every model turn "
        "samples only among them (either engine), so each turn is an action the environment's "
        "action tokenizer decodes; a turn is complete at rollout.max_new_tokens of them (set it to the "
        "action's dimensions). A filter: the logprobs stay those of the unfiltered distribution, as the "
        "trainer scores them. Empty: every token may be sampled.",
    )
    grammar: str | list[str] | None = Field(
        None,
        description="A grammar every model turn of the run's own episodes follows, training and validation "
        "(llguidance's Lark syntax: `start: call | answer`, quoted literals, regular expressions, `<tool_call>` "
        "for a special token or `<[105]>` for a token id), e.g. tool calls whose arguments can only be "
        "valid values. A filter, as action_token_ids: the logprobs stay those of the unconstrained "
        "distribution, as the trainer scores them. A list gives an environment's episodes one per turn: "
        "turn i follows grammar[i], the last one every later turn (e.g. a first turn that must call a tool); "
        "prompt rows use the first. rollout.engine=reference; not with an agent source (an agent sends "
        "response_format per request). None: free text.",
    )
    generation_batch_size: int = Field(
        64, gt=0, description="Sequences decoded together by the reference engine."
    )
    gpu_memory_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="GPU memory share for the fast engine's KV cache, less its weights and an activation "
        "reserve. At build and at every wake the cache takes at most what is free then (beside a "
        "colocated trainer's optimizer state it may run smaller, with a warning; rollout/kv_tokens shows "
        "its size).",
    )
    val_temperature: float = Field(0.0, ge=0, description="Temperature during validation (0 = greedy).")
    val_samples_per_prompt: int = Field(1, gt=0, description="Samples per validation prompt.")
    val_pass_k: list[int] = Field(
        default_factory=list,
        description="Report val/pass@k (unbiased, Chen et al. 2021) and val/mean@k (mean reward of k samples) "
        "for each k, overall, per data_source and per environment; each k at most val_samples_per_prompt "
        "(sample with val_temperature > 0 for k > 1).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="Most policy versions (weight publications) an episode's oldest token may lag the "
        "trainer's "
        "weights when it is trained on. 0: synchronous RL, each iteration samples with the latest weights. "
        "k >= 1: the replicas sample the next k iterations' prompts while the trainer updates (they overlap "
        "on Ray with cluster.placement=split); importance correction (algorithm.rollout_correction) "
        "covers the gap.",
    )
    stale_groups: Literal["drop", "regenerate"] = Field(
        "drop",
        description="A group with an episode over max_staleness: `drop` replaces it with fresh prompts, "
        "`regenerate` samples the same prompts again with the current weights.",
    )
    swap_mid_generation: Literal["continue", "restart", "off"] = Field(
        "continue",
        description="On Ray with cluster.placement=split (or colocated with cluster.engine_sleeps=false) "
        "and rollout.engine=fast, where replicas generate "
        "while the trainer updates (rollout.max_staleness >= 1): a weight publication reaches each replica "
        "between two decode steps of the generate call in progress instead of waiting for the call to end. "
        "`continue`: sequences in flight keep their K/V and go on with the new weights; `restart`: they are "
        "sampled again from their prompt; `off`: the publication waits for the call. Every token records "
        "the version that sampled it either way. Elsewhere publications never overlap generation.",
    )
    source: Source = Field(
        default_factory=PromptSourceConfig,
        description="Where episodes come from: `prompt` (one response per prompt, scored by reward.fn), "
        "{name: env, env: NAME, max_turns, max_episode_tokens} (an environment's multi-turn episodes) or "
        "{name: agent, agent: pkg.module:run, timeout_s, concurrency, max_turns, max_episode_tokens} (an "
        "agent written against the OpenAI API); a name or {name: ..., <its own settings>}.",
    )

    env_isolation: Literal["process", "inline"] = Field(
        "process",
        description="With an env or agent source: `process` runs the environments out of the "
        "controller "
        "(a hang or crash costs episodes, not the run): with cluster.backend=inline in worker processes on "
        "this machine, started for each batch; with cluster.backend=ray in Ray actors spread over the "
        "cluster's nodes, kept for the whole run (replaced when one fails). Agents (an agent source) and the "
        "one reset per row that renders the prompts at start-up always run in processes on the controller's "
        "node. `inline` runs them in the controller (breakpoint() works; a hang hangs the run).",
    )
    env_timeout_s: float = Field(
        60.0,
        gt=0,
        description="With rollout.env_isolation=process: most seconds one reset or step may take; past "
        "it the "
        "process (Ray actor) is killed and replaced, and its episodes end with the error.",
    )
    env_memory_limit_mb: int = Field(
        8192,
        ge=0,
        description="With rollout.env_isolation=process: MiB of memory each environment (or agent) process "
        "or Ray actor may use, as private writable memory (RLIMIT_DATA: heap, arrays, thread stacks; not "
        "shared libraries, GPU mappings nor address space merely reserved), also for each process it starts. "
        "An allocation past it raises MemoryError in the reset or step (or the agent), which costs that "
        "episode; the process serves on. 0: no limit.",
    )
    env_workers: int | None = Field(
        None,
        gt=0,
        description="With rollout.env_isolation=process: environment (or agent) processes (null: min(4, "
        "CPUs)); "
        "with cluster.backend=ray, environment actors (null: 4 per node, as many as the CPUs the workers "
        "leave free hold).",
    )
    env_cpus: float = Field(
        1.0,
        gt=0,
        description="With cluster.backend=ray and rollout.env_isolation=process: CPUs each environment actor "
        "asks Ray for (on top of the workers' cluster.cpus_per_worker).",
    )
    env_workers_per_node: int = Field(
        4,
        gt=0,
        description="With cluster.backend=ray and rollout.env_isolation=process, when rollout.env_workers is "
        "null: environment (simulator) actors per node, as many as the free CPUs (and GPUs, with "
        "rollout.env_gpus) hold. `ascent doctor` reports the placement of simulator workers.",
    )
    env_gpus: float = Field(
        0.0,
        ge=0,
        le=1,
        description="With cluster.backend=ray and rollout.env_isolation=process: the share of a GPU each "
        "environment actor asks Ray for, for simulators that render on the GPU (MuJoCo through EGL): 0.25 "
        "places 4 simulator workers per GPU. 0: CPU only (state-only rows, or OSMesa). `ascent doctor` "
        "checks that GPUs are visible and that EGL renders.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: Any) -> Any:
        """The older flat source fields (`rollout.env`, ...) are refused with the new spelling; a setting
        the chosen source does not read is refused naming the source that does (see sources.py)."""
        if not isinstance(data, dict):
            return data
        legacy = legacy_problem(data)
        if legacy is not None:
            raise rule_error([legacy])
        source = data.get("source")
        if isinstance(source, dict) and "name" not in source:
            data = data | {"source": {"name": DEFAULT_SOURCE} | source}
        problems = source_problems(data.get("source"))
        if problems:
            raise rule_error(problems)
        return data

    @field_validator("grammar")
    @classmethod
    def _grammar_compiles(cls, value: str | list[str] | None) -> str | list[str] | None:
        """The grammar (each, for a list) must compile (llguidance's Lark): its error, with the line, in the
        field's message."""
        if isinstance(value, list) and not value:
            raise ValueError("give at least one grammar, or leave rollout.grammar out")
        for i, grammar in enumerate([value] if isinstance(value, str) else value or []):
            error = _lark_error(grammar)
            if error:
                where = "the grammar" if isinstance(value, str) else f"grammar {i} (turn {i + 1})"
                raise ValueError(f"{where} does not compile: {error} (llguidance's Lark syntax)")
        return value

    @model_validator(mode="after")
    def _engine_options(self) -> RolloutConfig:
        problems = []
        if self.prefix_caching and self.batch_invariant:
            problems.append(
                "rollout.prefix_caching=true with rollout.batch_invariant=true: a prefix-cache hit depends on "
                "the other requests; set rollout.prefix_caching=false (or batch_invariant=false)."
            )
        if self.batch_invariant and self.tensor_parallel > 1:
            problems.append(
                f"rollout.batch_invariant=true with rollout.tensor_parallel={self.tensor_parallel}: the "
                "batch-invariant mode runs a replica on one GPU; set rollout.tensor_parallel=1."
            )
        if self.shared_prefix_attention and self.batch_invariant:
            problems.append(
                "rollout.shared_prefix_attention=true with rollout.batch_invariant=true: a group's shared "
                "read depends on the other rows; set rollout.shared_prefix_attention=false."
            )
        for name in ("prefix_caching", "batch_invariant", "shared_prefix_attention"):
            if getattr(self, name) and self.engine == "reference":
                problems.append(
                    f"rollout.{name}=true with rollout.engine=reference: only the fast engine has it; set "
                    "rollout.engine=fast."
                )
        if self.quantization != "none" and self.engine == "reference":
            problems.append(
                f"rollout.quantization={self.quantization} with rollout.engine=reference: only the fast engine "
                "quantises its weights; set rollout.engine=fast (or rollout.quantization=none)."
            )
        if self.grammar is not None and self.engine != "reference":
            problems.append(
                f"rollout.grammar with rollout.engine={self.engine}: only the reference engine samples under a "
                "grammar; set rollout.engine=reference (or drop rollout.grammar)."
            )
        if self.grammar is not None and self.source.name == "agent":
            problems.append(
                "rollout.grammar with an agent source: an agent's requests reach the endpoint, which takes a "
                "grammar per request (response_format, guided_regex); drop rollout.grammar."
            )
        if problems:
            raise rule_error(problems)
        return self

    @property
    def multi_turn(self) -> bool:
        """Episodes come from an environment or an agent (they bring their own prompts and rewards)."""
        return not isinstance(self.source, PromptSourceConfig)

    @property
    def response_budget(self) -> int:
        """The most response tokens of one episode: the source's max_episode_tokens with an environment or
        an agent (model turns and observations), else max_new_tokens."""
        if isinstance(self.source, PromptSourceConfig):
            return self.max_new_tokens
        return self.source.max_episode_tokens


def _lark_error(grammar: str) -> str:
    """llguidance's complaint about a Lark grammar ('' when it compiles)."""
    try:
        compiled = llguidance.LLMatcher.grammar_from_lark(grammar)
    except (ValueError, RuntimeError) as exc:
        return str(exc)
    return str(llguidance.LLMatcher.validate_grammar(compiled))
