"""Memory per GPU of a run, as plain arithmetic over flat inputs (no torch, no config): `ascent doctor` and
`bench/memory_estimate.py` call `estimate(inputs)`.

Every term mirrors what the code holds (bytes; P parameters, V vocabulary, H hidden, I intermediate, L layers,
N tokens of a micro-batch, e the compute dtype's element size). A mixture-of-experts model holds all its
parameters (weights, gradients, moments, engine weights: P counts every expert) while a token's activations
go through its k chosen experts only (`ModelShape.mlp_width`; `active_params` is what the doctor reports):

- trainer state (`ascent.trainer.policy`): weights in the parameter dtype (fp32 masters: 4 B; LoRA: the frozen
  base in the compute dtype plus fp32 adapters), gradients of what trains in the same dtype, AdamW's two fp32
  moments. `train.offload_optimizer` moves moments (and the fp32 masters' copy) to the CPU;
  `train.sharding=fsdp` divides the three by the trainer ranks and gathers one layer at a time in the compute
  dtype.
- activations of one micro-batch (`ascent.trainer.logprobs`, `head.py`): with gradient checkpointing each
  decoder layer keeps its input (the residual stream in the parameter dtype, L x N x H) and one layer is
  recomputed at a time (its working set: 4 [N, I] and 6 [N, H] buffers in the compute dtype); without it every
  layer keeps its working set. The LM head runs as one autograd function over chunks of
  `logprob_chunk_tokens` rows: a compute-dtype copy of the [V, H] weight, an fp32 [V, H] weight-gradient
  buffer (when the head trains) and one [chunk, V] logits buffer (compiled; eager adds two fp32 ones), plus
  the [M, H] response rows; `train.keep_head_logits` keeps all [M, V] logits for the backward. SDPA
  attention adds the dense [N, N] block-causal mask.
- sequence parallelism (`train.sequence_parallel` = S, `ascent.trainer.sequence_parallel`): a rank holds
  N/S tokens of every micro-batch through the decoder (layer inputs and working set; the Ulysses
  all-to-all turns its q/k/v into all N tokens of 1/S of the heads, the same bytes) and the head runs over
  its M/S response rows; the SDPA mask (off CUDA) still spans the whole row.
- the frozen reference (a KL term, full fine-tuning): P x e, resident on the trainer GPU.
- the critic (GAE): the policy's state without the LM head, and its own micro-batch activations (no
  vocabulary).
- the fast engine (`ascent.rollout.fast`): its own weights (fp32 embedding and norms, the rest and a tied
  head's copy in the compute dtype), a KV cache of `gpu_memory_fraction` x GPU memory less its weights and
  activation reserve (`pages_for_budget`), and the activations it actually uses (prefill of the step's
  prompts, fp32 decode logits). Colocated, it frees cache and weights for the update; the update is the
  trainer's peak. At every wake the engine caps its cache by what is free (`kv_wake_bytes`): beside a
  colocated trainer's state with its AdamW moments it may run smaller than the fraction asks. The reference engine: the model in the compute dtype, a padded KV cache of its generation
  batch.

Calibration against BENCHMARKS.md (H100, bench/e2e.py: 0.5B at 16384 / 24576 tokens, 1.5B at 24576 / 2048):
these terms land 2-3% above the measured peak allocated memory. `bench/memory_estimate.py` re-measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30
# Fast engine defaults the run does not override (`build_fast_engine`).
ENGINE_MAX_BATCH = 256
ENGINE_MAX_PREFILL = 16384
ENGINE_SLACK = 512 << 20
# What the CUDA caching allocator reserves over what is allocated (BENCHMARKS: reserved / allocated
# 1.07-1.12),
# and the CUDA context, which no allocator counts.
FRAGMENTATION = 0.10
CUDA_CONTEXT = 512 << 20


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only LM (from its config.json; `params` counted on the meta device)."""

    params: int
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    # Mixture of experts (0 experts: dense): `moe_layers` layers route each token to `experts_per_token` of
    # `experts` SwiGLU experts of width `expert_intermediate` (Qwen3-MoE's moe_intermediate_size).
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    moe_layers: int = 0
    context: int = 0  # max_position_embeddings: the fast engine's max_model_len (0: unknown)

    @property
    def active_params(self) -> int:
        """Parameters one token goes through: all of a dense model's, an MoE's less its unchosen experts."""
        unchosen = self.moe_layers * (self.experts - self.experts_per_token)
        return self.params - unchosen * 3 * self.hidden * self.expert_intermediate

    @property
    def mlp_width(self) -> int:
        """Intermediate activations per token in an MLP: the dense width, or k experts' for an MoE."""
        return self.experts_per_token * self.expert_intermediate if self.experts else self.intermediate

    @property
    def engine_mlp_width(self) -> int:
        """The fast engine's MLP buffer per token: the dense width, or one expert's (it runs them in turn)."""
        return self.expert_intermediate if self.experts else self.intermediate

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def norm_params(self) -> int:
        return (2 * self.layers + 1) * self.hidden

    def kv_bytes_per_token(self, elt: int) -> int:
        """K and V of one token over all layers (`ModelSpec.kv_bytes_per_token`)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * elt

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """A and B matrices (rank x in + out x rank) of every targeted projection of every layer."""
        q, kv, h, i = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.intermediate,
        )
        dims = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        per_layer = sum(rank * (a + b) for name, (a, b) in dims.items() if name in targets)
        return per_layer * self.layers


@dataclass(frozen=True)
class MemoryInputs:
    """What the run does, flat. `micro_batch_tokens`: tokens of the largest micro-batch (N);
    `response_tokens`: its response rows (M). `gpu_bytes`: memory of one GPU (0: unknown)."""

    shape: ModelShape
    compute_bytes: int = 2
    gradient_checkpointing: bool = False
    compiled: bool = True
    attention: str = "varlen"  # varlen | sdpa
    micro_batch_tokens: int = 8192
    response_tokens: int = 4096
    logprob_chunk: int = 1024
    keep_head_logits: bool = False  # the update keeps the head's [M, V] logits for its backward
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    offload_optimizer: bool = False
    fsdp_ranks: int = 1
    sequence_parallel: int = 1  # ranks sharing each micro-batch (each holds 1/S of its tokens)
    reference: bool = False
    critic: bool = False
    engine: str = "fast"  # fast | reference
    colocated: bool = True  # engine and trainer on the same GPU
    engine_sleeps: bool = True  # a colocated fast engine frees its memory for the update
    gpu_memory_fraction: float = 0.5
    gpu_bytes: int = 0
    rollout_rows: int = 64  # sequences decoded together
    prefill_tokens: int = 4096  # prompt tokens prefilled together (at most ENGINE_MAX_PREFILL)
    sequence_tokens: int = 768  # prompt + response of the longest sequence
    generation_batch_size: int = 64


@dataclass
class Estimate:
    """Bytes per term of each phase on each GPU; `peak` is the largest phase total of a GPU."""

    phases: dict[str, dict[str, int]] = field(default_factory=dict)  # "trainer GPU: update" -> terms
    kv_cache: int = 0  # the fast engine's KV cache as it runs (capped by free memory at wake)
    kv_asked: int = 0  # what rollout.gpu_memory_fraction asks
    kv_tokens: int = 0
    host_bytes: int = 0  # CPU memory that offloading moves there

    def total(self, phase: str) -> int:
        return sum(self.phases[phase].values())

    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> int:
        return self.total(self.peak_phase()) if self.phases else 0

    def needed(self) -> int:
        """The peak plus allocator fragmentation and the CUDA context: what the GPU must have."""
        return int(self.peak * (1 + FRAGMENTATION)) + CUDA_CONTEXT


# ------------------------------------------------------------------------------------------------ terms
def trainable_params(m: MemoryInputs) -> int:
    return m.shape.lora_params(m.lora_rank, m.lora_targets) if m.lora_rank else m.shape.params


def weight_bytes(m: MemoryInputs) -> int:
    """Policy weights on the GPU: fp32 masters, or (LoRA) the base in the compute dtype plus fp32 adapters;
    an FSDP rank holds 1/ranks of them (of both, with LoRA)."""
    if m.lora_rank:
        return (m.shape.params * m.compute_bytes + 4 * trainable_params(m)) // m.fsdp_ranks
    return 4 * m.shape.params // m.fsdp_ranks


def gradient_bytes(m: MemoryInputs) -> int:
    """fp32 gradients of what trains (kept across micro-batches until the optimizer step)."""
    return 4 * trainable_params(m) // m.fsdp_ranks


def optimizer_bytes(m: MemoryInputs) -> int:
    """AdamW's exp_avg and exp_avg_sq in fp32 on the GPU (0 when offloaded to the CPU)."""
    if m.offload_optimizer:
        return 0
    return 8 * trainable_params(m) // m.fsdp_ranks


def offload_host_bytes(m: MemoryInputs) -> int:
    """CPU memory of `train.offload_optimizer`: fp32 masters, moments and pinned gradient buffers (16 B)."""
    if not m.offload_optimizer:
        return 0
    return 16 * trainable_params(m) // m.fsdp_ranks


def fsdp_gather_bytes(m: MemoryInputs) -> int:
    """Unsharded weights FSDP2 gathers in the compute dtype: two decoder layers (one prefetched) and the
    root's embedding / head."""
    if m.fsdp_ranks <= 1:
        return 0
    s = m.shape
    layer = (s.params - s.embed_params * (1 if s.tied else 2)) // max(s.layers, 1)
    return (2 * layer + s.embed_params) * m.compute_bytes


def residual_bytes(m: MemoryInputs) -> int:
    """Element size of the residual stream: the parameter dtype (fp32 masters), the compute dtype with
    LoRA."""
    return m.compute_bytes if m.lora_rank else 4


def layer_working_set(m: MemoryInputs, tokens: int) -> int:
    """One decoder layer's saved activations for `tokens` tokens: 4 [N, I] (gate, up, act, product) and
    6 [N, H] (q, attention output, norms, projections' inputs) in the compute dtype. An MoE layer: I is the
    k chosen experts' widths together, and each token's k copies in and out of its experts add 2k [N, H]."""
    s = m.shape
    moe_copies = 2 * s.experts_per_token * s.hidden if s.experts else 0
    return tokens * (4 * s.mlp_width + 6 * s.hidden + moe_copies) * m.compute_bytes


def attention_mask_bytes(m: MemoryInputs, tokens: int) -> int:
    """SDPA over a packed row builds a dense [N, N] boolean block-causal mask; varlen needs none."""
    return tokens * tokens if m.attention == "sdpa" else 0


def rank_tokens(m: MemoryInputs, tokens: int) -> int:
    """Tokens of a `tokens`-token micro-batch one rank runs through the decoder (1/S with sequence
    parallelism, the row padded to a multiple of S)."""
    return -(-tokens // max(m.sequence_parallel, 1))


def body_activation_bytes(m: MemoryInputs, tokens: int) -> int:
    """The decoder stack's activations kept for backward over one micro-batch, on one rank."""
    s = m.shape
    local = rank_tokens(m, tokens)
    per_layer_input = local * s.hidden * residual_bytes(m)
    if m.gradient_checkpointing:
        kept = s.layers * per_layer_input + layer_working_set(m, local)
    else:
        kept = s.layers * (per_layer_input + layer_working_set(m, local))
    return kept + attention_mask_bytes(m, tokens)


def head_bytes(m: MemoryInputs, grad: bool = True) -> int:
    """The LM head over the response rows: the weight cast to the compute dtype, an fp32 [V, H] weight
    gradient (when the head trains), the [M, H] rows, one [chunk, V] logits buffer (plus two fp32 ones
    when not compiled), and with `keep_head_logits` in a backward pass all [M, V] logits."""
    s = m.shape
    chunk = min(m.logprob_chunk, max(m.response_tokens, 1))
    cast = s.embed_params * m.compute_bytes if m.compute_bytes != 4 and not m.lora_rank else 0
    weight_grad = 4 * s.embed_params if grad and not m.lora_rank else 0
    m_rows = rank_tokens(m, m.response_tokens)
    rows = m_rows * s.hidden * (residual_bytes(m) + m.compute_bytes)
    logits = chunk * s.vocab * (m.compute_bytes + (0 if m.compiled else 8))
    kept = m_rows * s.vocab * m.compute_bytes if grad and m.keep_head_logits else 0
    return cast + weight_grad + rows + logits + kept


def reference_bytes(m: MemoryInputs) -> int:
    """The frozen reference policy in the compute dtype (LoRA: the base itself, nothing extra)."""
    return m.shape.params * m.compute_bytes if m.reference and not m.lora_rank else 0


def critic_state_bytes(m: MemoryInputs) -> int:
    """The critic: the policy's decoder without its LM head, trained in full (16 B/param, FSDP-sharded)."""
    if not m.critic:
        return 0
    s = m.shape
    params = s.params - (0 if s.tied else s.embed_params)
    per_param = 4 + 4 + (0 if m.offload_optimizer else 8)
    return per_param * params // m.fsdp_ranks


def engine_weight_bytes(m: MemoryInputs) -> int:
    """The rollout engine's own weights. Fast: embedding and norms fp32, the rest in the compute dtype, a
    tied head copied in the compute dtype. Reference engine: the checkpoint in the compute dtype."""
    s = m.shape
    if m.engine != "fast":
        return s.params * m.compute_bytes
    matrices = s.params - s.embed_params * (1 if s.tied else 2) - s.norm_params
    head = s.embed_params * m.compute_bytes if (not s.tied or m.compute_bytes != 4) else 0
    return matrices * m.compute_bytes + 4 * (s.embed_params + s.norm_params) + head


def engine_reserve_bytes(m: MemoryInputs) -> int:
    """The activation reserve the fast engine keeps out of its KV budget (`_activation_reserve`)."""
    s = m.shape
    decode = ENGINE_MAX_BATCH * s.vocab * 4 * 8
    prefill = ENGINE_MAX_PREFILL * (3 * s.engine_mlp_width + 8 * s.hidden) * m.compute_bytes * 2
    return decode + prefill + ENGINE_SLACK


def engine_activation_bytes(m: MemoryInputs) -> int:
    """What generation actually uses: one layer of the prefill, fp32 decode logits and sampler temporaries."""
    s = m.shape
    prefill = (
        min(m.prefill_tokens, ENGINE_MAX_PREFILL) * (3 * s.engine_mlp_width + 8 * s.hidden) * m.compute_bytes
    )
    decode = min(m.rollout_rows, ENGINE_MAX_BATCH) * s.vocab * 4 * 3
    return prefill + decode


def kv_cache_bytes(m: MemoryInputs) -> int:
    """Fast engine on a GPU: fraction x GPU memory, less its weights and reserve (`pages_for_budget`; <= 0:
    nothing fits). Without a known GPU size, or for the reference engine: its padded batch's K and V."""
    if m.engine == "fast" and m.gpu_bytes:
        return int(m.gpu_memory_fraction * m.gpu_bytes) - engine_weight_bytes(m) - engine_reserve_bytes(m)
    rows = m.generation_batch_size if m.engine != "fast" else min(m.rollout_rows, ENGINE_MAX_BATCH)
    return rows * m.sequence_tokens * m.shape.kv_bytes_per_token(m.compute_bytes)


def kv_wake_bytes(m: MemoryInputs) -> int:
    """The fast engine's KV cache as it runs (`ascent.rollout.fast.pool`): the asked `kv_cache_bytes`,
    capped at every wake by what the GPU has free then less the activation reserve. Colocated, a sleeping
    engine wakes beside the trainer's state, AdamW's moments included (they exist from the first update
    on), so that is what caps it (below one request the engine refuses to run). An awake colocated engine
    is sized once, at build: the asked size."""
    asked = kv_cache_bytes(m)
    if m.engine != "fast" or not m.gpu_bytes or (m.colocated and not m.engine_sleeps):
        return asked
    held = CUDA_CONTEXT + engine_weight_bytes(m) + engine_reserve_bytes(m)
    if m.colocated:
        held += sum(trainer_state(m, with_grads=False).values())
    return min(asked, m.gpu_bytes - held)


def kv_floor_bytes(m: MemoryInputs) -> int:
    """K and V of one request of the engine's context (the model's, else the run's longest sequence) plus
    the trash page: the smallest pool the fast engine runs with."""
    tokens = (m.shape.context or m.sequence_tokens) + 64
    return tokens * m.shape.kv_bytes_per_token(m.compute_bytes)


# ----------------------------------------------------------------------------------------------- phases
def trainer_state(m: MemoryInputs, with_grads: bool) -> dict[str, int]:
    """What the trainer GPU holds between calls (gradients only inside an update)."""
    terms = {
        "weights": weight_bytes(m),
        "optimizer (AdamW moments)": optimizer_bytes(m),
        "reference model": reference_bytes(m),
        "critic (weights, grads, AdamW)": critic_state_bytes(m),
    }
    if with_grads:
        terms["gradients"] = gradient_bytes(m)
    return terms


def update_terms(m: MemoryInputs) -> dict[str, int]:
    """The optimizer step's peak: state, gradients, one micro-batch's activations and the LM head."""
    return trainer_state(m, with_grads=True) | {
        "activations (micro-batch)": body_activation_bytes(m, m.micro_batch_tokens),
        "LM head (logprob chunks)": head_bytes(m),
        "FSDP gathered layers": fsdp_gather_bytes(m),
    }


def logprob_terms(m: MemoryInputs) -> dict[str, int]:
    """A no-grad forward (old or reference logprobs): one layer's working set at a time, the head chunk."""
    return trainer_state(m, with_grads=False) | {
        "activations (no-grad forward)": layer_working_set(m, rank_tokens(m, m.micro_batch_tokens))
        + rank_tokens(m, m.micro_batch_tokens) * m.shape.hidden * residual_bytes(m)
        + attention_mask_bytes(m, m.micro_batch_tokens),
        "LM head (logprob chunks)": head_bytes(m, grad=False),
        "FSDP gathered layers": fsdp_gather_bytes(m),
    }


def engine_terms(m: MemoryInputs) -> dict[str, int]:
    return {
        "engine weights": engine_weight_bytes(m),
        "KV cache": max(kv_wake_bytes(m), 0),
        "engine activations": engine_activation_bytes(m),
    }


def estimate(m: MemoryInputs) -> Estimate:
    """Per-phase bytes on the trainer's GPU and (split placement) the engine's GPU."""
    out = Estimate(kv_cache=kv_wake_bytes(m), kv_asked=kv_cache_bytes(m), host_bytes=offload_host_bytes(m))
    out.kv_tokens = max(out.kv_cache, 0) // max(m.shape.kv_bytes_per_token(m.compute_bytes), 1)
    engine = engine_terms(m)
    if m.colocated:
        out.phases["rollout"] = trainer_state(m, with_grads=False) | engine
        if m.engine != "fast" or not m.engine_sleeps:  # the engine stays while the trainer runs
            # the reference engine keeps its weights; an awake fast engine (cluster.engine_sleeps=false) all
            kept = engine if m.engine == "fast" else {"engine weights": engine["engine weights"]}
            out.phases["logprobs"] = logprob_terms(m) | kept
            out.phases["update"] = update_terms(m) | kept
            return out
    else:
        out.phases["rollout GPU: generate"] = engine
    out.phases["logprobs"] = logprob_terms(m)
    out.phases["update"] = update_terms(m)
    return out


def knobs(m: MemoryInputs, est: Estimate) -> list[str]:
    """The config fields that shrink the largest terms of the peak phase, largest first."""
    terms = sorted(est.phases[est.peak_phase()].items(), key=lambda kv: -kv[1])
    advice = {
        "weights": "model.lora.rank=16 or train.sharding=fsdp with more cluster.num_trainer_workers",
        "gradients": "model.lora.rank=16 or train.sharding=fsdp with more cluster.num_trainer_workers",
        "optimizer (AdamW moments)": "train.offload_optimizer=true (or model.lora.rank=16)",
        "activations (micro-batch)": "lower train.max_tokens_per_micro_batch"
        + ("" if m.gradient_checkpointing else ", set model.gradient_checkpointing=true")
        + " or raise train.sequence_parallel (more trainer ranks share each micro-batch)",
        "LM head (logprob chunks)": "lower train.logprob_chunk_tokens"
        + (" or set train.keep_head_logits=false" if m.keep_head_logits else ""),
        "KV cache": "lower rollout.gpu_memory_fraction",
        "reference model": "model.lora.rank=16 (the reference is then the base, no copy) or "
        "algorithm.kl_loss_coef=0 and algorithm.kl_penalty_coef=0",
        "critic (weights, grads, AdamW)": "train.sharding=fsdp over more cluster.num_trainer_workers",
    }
    out: list[str] = []
    for name, size in terms:
        tip = advice.get(name)
        if tip and size > 0 and tip not in out:
            out.append(tip)
    return out[:3]


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"
