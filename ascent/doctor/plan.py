"""From a run config and the model's shape to the doctor's numbers: the flat `MemoryInputs` of
`ascent.doctor.memory`, the memory check (fits the GPU or not, and which field to turn), what the run writes
to disk, and how many GPUs it spans.
"""

from __future__ import annotations

import dataclasses
import shutil

from ascent.cluster.mps import CONTROL, node_daemon
from ascent.config.schema import RunConfig
from ascent.doctor.cluster import demand
from ascent.doctor.memory import (
    CUDA_CONTEXT,
    GIB,
    Estimate,
    MemoryInputs,
    ModelShape,
    estimate,
    gib,
    head_bytes,
    knobs,
    kv_floor_bytes,
    rank_tokens,
    trainer_state,
)
from ascent.doctor.report import CheckResult, fail, ok, skipped, warn
from ascent.models.ulysses import check_heads, largest_degree
from ascent.orchestrator.placement import uses_critic
from ascent.orchestrator.setup import computes_beside_engine, needs_reference

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def on_gpu(cfg: RunConfig, gpus_visible: int) -> bool:
    """Whether the workers run on CUDA: cluster.device=cuda, or auto with a GPU here or GPUs asked of Ray."""
    device = cfg.cluster.device
    return device == "cuda" or (device == "auto" and (gpus_visible > 0 or cfg.cluster.gpus_per_worker > 0))


def trainer_attention(cfg: RunConfig, gpu: bool) -> str:
    """`train.attention` resolved as the trainer resolves it: auto -> varlen on CUDA in half precision."""
    a = cfg.train.attention
    if a != "auto":
        return a
    return "varlen" if gpu and cfg.model.dtype in ("bf16", "fp16") else "sdpa"


def micro_batch(cfg: RunConfig) -> tuple[int, int, int]:
    """(tokens, response tokens, longest sequence) of the largest micro-batch one trainer rank packs (with
    sequence parallelism: one group of ranks, which pools its ranks' shares)."""
    seq = cfg.data.max_prompt_tokens + cfg.rollout.response_budget
    groups = max(cfg.cluster.num_trainer_workers // cfg.train.sequence_parallel, 1)
    share = max(cfg.train.trajectories_per_update // groups, 1)
    fit = max(min(share, cfg.train.max_tokens_per_micro_batch // seq), 1)
    return fit * seq, fit * cfg.rollout.response_budget, seq


def memory_inputs(cfg: RunConfig, shape: ModelShape, gpu_bytes: int, gpus_visible: int) -> MemoryInputs:
    c, r, t = cfg.cluster, cfg.rollout, cfg.train
    gpu = on_gpu(cfg, gpus_visible)
    tokens, response, seq = micro_batch(cfg)
    replicas = max(c.num_rollout_workers, 1)
    prompts = -(-r.prompts_per_step // replicas)
    return MemoryInputs(
        shape=shape,
        compute_bytes=DTYPE_BYTES[cfg.model.dtype],
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        compiled=t.compile == "on" or (t.compile == "auto" and gpu),
        attention=trainer_attention(cfg, gpu),
        micro_batch_tokens=tokens,
        response_tokens=response,
        logprob_chunk=t.logprob_chunk_tokens,
        keep_head_logits=t.keep_head_logits,
        lora_rank=cfg.model.lora.rank,
        lora_targets=tuple(cfg.model.lora.target_modules),
        offload_optimizer=t.offload_optimizer,
        fsdp_ranks=c.num_trainer_workers if t.sharding == "fsdp" else 1,
        sequence_parallel=t.sequence_parallel,
        reference=needs_reference(cfg),
        critic=uses_critic(cfg),
        engine="fast" if r.engine == "fast" else "reference",
        colocated=not (c.backend == "ray" and c.placement == "split" and c.gpus_per_worker > 0),
        engine_sleeps=c.engine_sleeps,
        gpu_memory_fraction=r.gpu_memory_fraction,
        gpu_bytes=gpu_bytes if gpu else 0,
        rollout_rows=prompts * r.samples_per_prompt,
        prefill_tokens=prompts * cfg.data.max_prompt_tokens,
        sequence_tokens=seq,
        generation_batch_size=r.generation_batch_size,
    )


def check_micro_batch(cfg: RunConfig) -> CheckResult | None:
    _, _, seq = micro_batch(cfg)
    budget = cfg.train.max_tokens_per_micro_batch
    if seq > budget:
        return warn(
            "micro-batch",
            f"a sequence may reach {seq} tokens (data.max_prompt_tokens + the response "
            f"budget) but train.max_tokens_per_micro_batch={budget}; the trainer refuses longer ones",
            f"raise train.max_tokens_per_micro_batch to {seq} or more.",
        )
    return None


def check_sequence_parallel(cfg: RunConfig, shape: ModelShape | None) -> CheckResult | None:
    """`train.sequence_parallel` against the model's attention heads (the trainer ranks refuse the same)."""
    degree = cfg.train.sequence_parallel
    if degree == 1 or shape is None:
        return None
    why = check_heads(shape.heads, shape.kv_heads, degree)
    if why:
        return fail(
            "sequence parallel",
            f"train.sequence_parallel={degree}: {why}",
            f"set train.sequence_parallel={largest_degree(shape.heads, shape.kv_heads, degree)} (it must "
            "divide the heads, and divide or be a multiple of the KV heads).",
        )
    groups = cfg.cluster.num_trainer_workers // degree
    return ok("sequence parallel", f"{groups} group(s) of {degree} ranks share each micro-batch")


def check_awake_engine(cfg: RunConfig) -> CheckResult | None:
    """cluster.engine_sleeps=false pays in two ways: on Ray, colocated, with rollout.max_staleness >= 1 the
    replicas generate during the update; in every colocated run the engine keeps its KV cache and CUDA
    graphs, so no iteration reallocates the one or recaptures the other. On Ray with staleness 0 only the
    second remains, for the memory of both."""
    c, r = cfg.cluster, cfg.rollout
    if c.engine_sleeps or c.placement == "split":
        return None
    if c.generates_alongside and r.max_staleness >= 1:
        return ok("awake engine", "the replicas generate the next iteration during the update")
    if c.backend != "ray":
        return ok(
            "awake engine",
            "generation and update take turns in one process; the engine keeps its KV cache and CUDA graphs "
            "through the update (no reallocation or graph recapture per iteration; the memory check counts "
            "both)",
        )
    return warn(
        "awake engine",
        "cluster.engine_sleeps=false keeps the engine's memory through the update, but "
        "rollout.max_staleness=0 gives the engine nothing to generate during the update",
        "set rollout.max_staleness=1, or leave cluster.engine_sleeps=true.",
    )


def check_mps(cfg: RunConfig, control_found: bool | None = None) -> CheckResult | None:
    """Where trainer ranks and replicas compute at once on the same GPUs, whether they will do it under MPS
    (`cluster.mps`, `ascent.cluster.mps`) or take turns in the GPU's time slices. `control_found`: whether
    nvidia-cuda-mps-control is on PATH (None: look)."""
    c = cfg.cluster
    if not computes_beside_engine(cfg):
        return None
    slices = "trainer ranks and replicas sharing a GPU will take turns on it (time slices)"
    if c.mps == "off":
        return warn(
            "mps", f"cluster.mps=off: {slices}", "set cluster.mps=auto to run them at once under MPS."
        )
    if c.address:
        return ok("mps", "a joined cluster: its workers use MPS where its nodes run it (cluster.mps docs)")
    if existing := node_daemon():
        return ok("mps", f"the workers will use the MPS daemon this node runs ({existing})")
    found = shutil.which(CONTROL) is not None if control_found is None else control_found
    if found:
        return ok("mps", "ascent starts an MPS daemon for the run: trainer and replica compute at once")
    return warn(
        "mps",
        f"{CONTROL} not found: {slices}, which cost the update 1.55-1.8x on H200s (README: cluster.mps)",
        "install the NVIDIA driver's utilities (the package that has nvidia-smi usually has it), or set "
        "cluster.mps=off to accept time slices.",
    )


def check_memory(m: MemoryInputs, est: Estimate, target: str) -> CheckResult:
    """Whether the peak phase fits `m.gpu_bytes` (with allocator fragmentation and the CUDA context)."""
    name = "memory per GPU"
    peak, phase = est.peak, est.peak_phase()
    text = f"estimated peak {gib(peak)} allocated ({phase})"
    data = {
        "peak_bytes": peak,
        "peak_phase": phase,
        "needed_bytes": est.needed(),
        "kv_cache_bytes": est.kv_cache,
        "phases": {p: dict(terms) for p, terms in est.phases.items()},
    }
    if (
        m.engine == "fast"
        and m.gpu_bytes
        and est.kv_asked < 2 * 64 * m.shape.kv_bytes_per_token(m.compute_bytes)
    ):
        return fail(
            name,
            f"rollout.gpu_memory_fraction={m.gpu_memory_fraction} of {target} leaves no KV cache "
            "after the engine's weights and activation reserve",
            "raise rollout.gpu_memory_fraction.",
            **data,
        )
    if m.engine == "fast" and m.gpu_bytes and est.kv_cache < min(est.kv_asked, kv_floor_bytes(m)):
        detail, fix = _kv_at_wake(m, est, target, short=True)
        return fail(name, detail, fix, **data)
    if m.sequence_parallel > 1:
        text += (
            f", train.sequence_parallel={m.sequence_parallel}: each rank holds "
            f"{rank_tokens(m, m.micro_batch_tokens):,} of a micro-batch's {m.micro_batch_tokens:,} tokens"
        )
        data["sequence_parallel"] = m.sequence_parallel
    if not m.gpu_bytes:
        return skipped(name, text + "; no GPU to compare with (pass --gpu-memory GIB)", **data)
    tips = "; ".join(knobs(m, est))
    if peak + CUDA_CONTEXT > m.gpu_bytes:
        return fail(name, f"{text} does not fit {target}", f"{tips}.", **data)
    if m.engine == "fast" and est.kv_cache < est.kv_asked:  # (the capped cache fills the GPU: not tight)
        detail, fix = _kv_at_wake(m, est, target)
        return warn(name, f"{text} of {target}; {detail}", fix, **data)
    if est.needed() > m.gpu_bytes:
        return warn(
            name, f"{text}: tight on {target} once the allocator's fragmentation counts", f"{tips}.", **data
        )
    kv = f"; KV cache {gib(est.kv_cache)} ({est.kv_tokens:,} tokens)" if m.engine == "fast" else ""
    return ok(name, f"{text} of {target}{kv}", **data)


def check_recompute(m: MemoryInputs, target: str) -> CheckResult | None:
    """model.gradient_checkpointing=true recomputes every decoder layer in backward: a third more matmul
    work. Where the estimate without it fits the GPU too, say so (the recomputation buys nothing there)."""
    if not m.gradient_checkpointing or not m.gpu_bytes:
        return None
    without = estimate(dataclasses.replace(m, gradient_checkpointing=False))
    if without.needed() > m.gpu_bytes:
        return ok("recompute", f"needed: without it the estimated peak is {gib(without.peak)} on {target}")
    return warn(
        "recompute",
        "model.gradient_checkpointing=true recomputes every decoder layer in backward, but the estimated "
        f"peak without it, {gib(without.peak)} ({without.peak_phase()}), fits {target} too",
        "set model.gradient_checkpointing=false: the update then skips the recomputation (1.2x faster at "
        "0.5B and 1.5B on an H200, BENCHMARKS.md); keep it where the GPU is shared with other work.",
        peak_bytes_without=without.peak,
    )


def check_kept_logits(m: MemoryInputs, target: str) -> CheckResult | None:
    """train.keep_head_logits: where it is off and the estimate with it still fits the GPU, say so (the
    update then skips the head's recomputed matmul); where it is on and the run does not fit, the memory
    check's fix names it. None off a GPU, or where it is on."""
    if m.keep_head_logits or not m.gpu_bytes:
        return None
    with_kept = dataclasses.replace(m, keep_head_logits=True)
    kept = estimate(with_kept)
    if kept.needed() > m.gpu_bytes:
        return None
    extra = head_bytes(with_kept) - head_bytes(m)
    return ok(
        "kept head logits",
        f"train.keep_head_logits=true would fit {target} (estimated peak {gib(kept.peak)}, {gib(extra)} "
        "more): the update then reads the head's logits instead of recomputing them (2-3% faster at 0.5B "
        "and 1.5B on an H200, BENCHMARKS.md)",
        peak_bytes_kept=kept.peak,
    )


def _kv_at_wake(m: MemoryInputs, est: Estimate, target: str, short: bool = False) -> tuple[str, str]:
    """(detail, fix) of a fast engine whose KV cache is capped at wake by what else the GPU holds (a
    colocated trainer's state, its AdamW moments included: `kv_wake_bytes`)."""
    beside = "the colocated trainer's state (weights, AdamW moments" if m.colocated else "its weights ("
    state = sum(trainer_state(m, with_grads=False).values()) if m.colocated else 0
    where = f"beside {beside}: {gib(state)}) on {target}" if m.colocated else f"on {target}"
    lever = "train.offload_optimizer=true or model.lora.rank=16" if m.colocated else "a larger GPU"
    if short:
        return (
            f"{where} the fast engine's KV cache gets {gib(max(est.kv_cache, 0))} at wake, less than one "
            f"request of its {m.shape.context or m.sequence_tokens:,}-token context needs "
            f"({gib(kv_floor_bytes(m))}): the engine stops with KVCacheOutOfMemory",
            f"{lever} (smaller trainer state), or cluster.placement=split (the engine on its own GPUs).",
        )
    return (
        f"{where} the fast engine's KV cache runs at {gib(est.kv_cache)} ({est.kv_tokens:,} tokens), not the "
        f"{gib(est.kv_asked)} rollout.gpu_memory_fraction={m.gpu_memory_fraction} asks (fewer sequences "
        "decode at once; rollout/kv_tokens shows it)",
        f"{lever} gives it the asked size; or lower rollout.gpu_memory_fraction to ask for what fits.",
    )


PROCESS_RUNTIME = 1 << 30  # Python, torch and transformers in one worker process, before any tensor


def host_bytes_needed(cfg: RunConfig, est: Estimate) -> tuple[int, str]:
    """(bytes of RAM a CPU run needs on this machine, how it was counted): the estimate's peak phase (weights,
    gradients, AdamW moments, activations; the engine's share) per trainer process, split engines' own
    processes, offloaded optimizer state, and each process's runtime."""
    c = cfg.cluster
    trainers = c.num_trainer_workers if c.backend == "ray" else 1
    split = c.backend == "ray" and c.placement == "split"
    engine_phase = next((p for p in est.phases if p.startswith("rollout GPU")), None)
    engines = c.num_rollout_workers if split and engine_phase else 0
    trainer_peak = max(est.total(p) for p in est.phases if p != engine_phase)
    total = trainers * trainer_peak + est.host_bytes + (trainers + engines) * PROCESS_RUNTIME
    if engines and engine_phase:
        total += engines * est.total(engine_phase)
    how = f"{trainers} trainer process(es) x {gib(trainer_peak)} peak"
    how += f" + {engines} engine process(es)" if engines else ""
    return total, how + f" + {gib(PROCESS_RUNTIME)} runtime each"


def check_host_memory(
    cfg: RunConfig, m: MemoryInputs, est: Estimate, total: int, available: int
) -> CheckResult:
    """A run on CPU: its RAM (`host_bytes_needed`) against this machine's total and available memory."""
    name = "host memory (CPU run)"
    needed, how = host_bytes_needed(cfg, est)
    text = f"estimated {gib(needed)} of RAM ({how})"
    data = {
        "needed_bytes": needed,
        "total_bytes": total,
        "available_bytes": available,
        "phases": {p: dict(terms) for p, terms in est.phases.items()},
    }
    if not total:
        return skipped(name, text + "; this machine's memory is unknown", **data)
    fix = "; ".join(knobs(m, est)) or "use a smaller model"
    if needed > total:
        return fail(name, f"{text}; the machine has {gib(total)}", fix + ".", **data)
    if needed > available:
        free = f"{text}; {gib(available)} of {gib(total)} is free now"
        return warn(name, free, f"stop other processes first, or {fix}.", **data)
    return ok(name, f"{text} of {gib(total)} ({gib(available)} free)", **data)


def checkpoint_bytes(cfg: RunConfig, shape: ModelShape) -> int:
    """One checkpoint: HF weights as the trainer saves them (fp32 masters; LoRA: merged in the compute dtype
    plus the adapter) and AdamW's moments when `checkpoint.save_optimizer`."""
    if cfg.model.lora.rank:
        trainable = shape.lora_params(cfg.model.lora.rank, tuple(cfg.model.lora.target_modules))
        weights = (
            shape.params * DTYPE_BYTES[cfg.model.dtype] if cfg.model.lora.save_merged else 0
        ) + 4 * trainable
    else:
        trainable, weights = shape.params, 4 * shape.params
    return weights + (8 * trainable if cfg.checkpoint.save_optimizer else 0)


def run_dir_bytes(cfg: RunConfig, shape: ModelShape) -> int:
    """Checkpoints kept (+1 being written, + `final`) and the experience store (~24 B per token)."""
    ckpt = checkpoint_bytes(cfg, shape) * (cfg.checkpoint.keep_last + 2)
    _, _, seq = micro_batch(cfg)
    episodes = cfg.iterations * cfg.trajectories_per_step * seq * 24 if cfg.tracking.experience_store else 0
    return ckpt + episodes


def ray_temp_bytes(cfg: RunConfig, shape: ModelShape) -> int:
    """Ray's session files and object spilling: a weight publication through the object store, plus 1 GiB."""
    return shape.params * DTYPE_BYTES[cfg.model.dtype] * 2 + GIB


def gpus_needed(cfg: RunConfig) -> tuple[int, int]:
    """(GPUs the run spans, GPUs it needs on this node): inline runs everything here."""

    c = cfg.cluster
    if c.backend == "inline":
        n = c.num_trainer_workers if c.device != "cpu" else 0
        return n, n
    if c.gpus_per_worker == 0:
        return 0, 0
    total = int(-(-demand(cfg).gpus // 1))
    return total, (total if not c.address else 0)


def run_estimate(
    cfg: RunConfig, shape: ModelShape, gpu_bytes: int, gpus_visible: int
) -> tuple[MemoryInputs, Estimate]:
    m = memory_inputs(cfg, shape, gpu_bytes, gpus_visible)
    return m, estimate(m)
