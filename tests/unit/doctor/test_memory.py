"""The memory arithmetic of `ascent doctor`, term by term, and against the H100 peaks in BENCHMARKS.md."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ascent.doctor import memory as M

GIB = 2**30


def qwen_shape(
    hidden: int, inter: int, layers: int, heads: int, kv: int = 2, vocab: int = 151936
) -> M.ModelShape:
    """A tied Qwen2.5 shape (q/k/v biases), its parameters counted as bench/e2e_workload.py counts them."""
    hd = hidden // heads
    per_layer = (
        2 * hidden * hidden + hidden + 2 * (hidden * kv * hd + kv * hd) + 3 * hidden * inter + 2 * hidden
    )
    return M.ModelShape(
        vocab * hidden + layers * per_layer + hidden, vocab, hidden, inter, layers, heads, kv, hd, True
    )


SHAPE = M.ModelShape(
    params=1000, vocab=10, hidden=4, intermediate=8, layers=2, heads=2, kv_heads=1, head_dim=2, tied=True
)
BASE = M.MemoryInputs(
    shape=SHAPE, compute_bytes=2, micro_batch_tokens=100, response_tokens=50, logprob_chunk=20
)


def test_trainer_state_is_16_bytes_per_parameter_with_fp32_masters():
    assert M.weight_bytes(BASE) == 4000
    assert M.gradient_bytes(BASE) == 4000
    assert M.optimizer_bytes(BASE) == 8000


def test_fsdp_divides_state_and_gathers_layers_in_the_compute_dtype():
    m = replace(BASE, fsdp_ranks=4)
    assert (M.weight_bytes(m), M.gradient_bytes(m), M.optimizer_bytes(m)) == (1000, 1000, 2000)
    layer = (1000 - 40) // 2
    assert M.fsdp_gather_bytes(m) == (2 * layer + 40) * 2
    assert M.fsdp_gather_bytes(BASE) == 0


def test_offload_moves_moments_to_the_host():
    m = replace(BASE, offload_optimizer=True)
    assert M.optimizer_bytes(m) == 0
    assert M.offload_host_bytes(m) == 16 * 1000
    assert M.estimate(m).host_bytes == 16000


def test_lora_trains_only_adapters_over_a_half_precision_base():
    m = replace(BASE, lora_rank=2, lora_targets=("q_proj", "down_proj"))
    adapters = 2 * (2 * (4 + 4) + 2 * (8 + 4))  # layers x (q: 4->4, down: 8->4) x rank
    assert M.trainable_params(m) == adapters
    assert M.weight_bytes(m) == 1000 * 2 + 4 * adapters
    assert M.gradient_bytes(m) == 4 * adapters
    assert M.optimizer_bytes(m) == 8 * adapters
    assert M.reference_bytes(replace(m, reference=True)) == 0  # the base with adapters off
    assert M.head_bytes(m) < M.head_bytes(BASE)  # frozen head: no fp32 weight gradient, no cast
    sharded = replace(m, fsdp_ranks=2)  # train.sharding=fsdp shards the base and the adapters alike
    assert M.weight_bytes(sharded) == (1000 * 2 + 4 * adapters) // 2
    assert M.optimizer_bytes(sharded) == 8 * adapters // 2
    assert M.fsdp_gather_bytes(sharded) > 0


def test_checkpointing_keeps_one_input_per_layer_and_one_working_set():
    n = 100
    work = n * (4 * 8 + 6 * 4) * 2
    assert M.layer_working_set(BASE, n) == work
    ckpt = replace(BASE, gradient_checkpointing=True)
    assert M.body_activation_bytes(ckpt, n) == 2 * n * 4 * 4 + work
    assert M.body_activation_bytes(BASE, n) == 2 * (n * 4 * 4 + work)


def test_sdpa_adds_a_dense_mask():
    assert M.attention_mask_bytes(replace(BASE, attention="sdpa"), 100) == 100 * 100
    assert M.attention_mask_bytes(BASE, 100) == 0


def test_head_terms():
    cast, grad, rows, logits = 40 * 2, 4 * 40, 50 * 4 * (4 + 2), 20 * 10 * 2
    assert M.head_bytes(BASE) == cast + grad + rows + logits
    assert M.head_bytes(BASE, grad=False) == cast + rows + logits
    eager = replace(BASE, compiled=False)
    assert M.head_bytes(eager) - M.head_bytes(BASE) == 20 * 10 * 8  # two fp32 [chunk, V] buffers
    kept = replace(BASE, keep_head_logits=True)  # every response row's logits, in the update only
    assert M.head_bytes(kept) - M.head_bytes(BASE) == 50 * 10 * 2
    assert M.head_bytes(kept, grad=False) == M.head_bytes(BASE, grad=False)
    sp = replace(BASE, sequence_parallel=2)  # a rank keeps its share of the rows
    assert M.head_bytes(replace(sp, keep_head_logits=True)) - M.head_bytes(sp) == 25 * 10 * 2


def test_reference_and_critic():
    assert M.reference_bytes(replace(BASE, reference=True)) == 2000
    assert M.critic_state_bytes(replace(BASE, critic=True)) == 16 * 1000  # tied: the embedding stays
    untied = replace(BASE, shape=replace(SHAPE, tied=False), critic=True)
    assert M.critic_state_bytes(untied) == 16 * (1000 - 40)


def test_fast_engine_weights_keep_embedding_and_norms_in_fp32():
    matrices = 1000 - 40 - (2 * 2 + 1) * 4
    assert M.engine_weight_bytes(BASE) == matrices * 2 + 4 * (40 + 20) + 40 * 2
    assert M.engine_weight_bytes(replace(BASE, engine="reference")) == 2000


def test_kv_cache_is_the_fraction_less_weights_and_reserve():
    gpu = 10 * GIB
    m = replace(BASE, gpu_bytes=gpu, gpu_memory_fraction=0.5)
    assert M.kv_cache_bytes(m) == int(0.5 * gpu) - M.engine_weight_bytes(m) - M.engine_reserve_bytes(m)
    ref = replace(BASE, engine="reference", generation_batch_size=8, sequence_tokens=30)
    assert M.kv_cache_bytes(ref) == 8 * 30 * SHAPE.kv_bytes_per_token(2)


def test_colocated_update_frees_the_engine_split_does_not_share_a_gpu():
    co = M.estimate(replace(BASE, gpu_bytes=GIB))
    assert "KV cache" in co.phases["rollout"] and "weights" in co.phases["rollout"]
    assert "KV cache" not in co.phases["update"]
    split = M.estimate(replace(BASE, gpu_bytes=GIB, colocated=False))
    assert "weights" not in split.phases["rollout GPU: generate"]


def test_an_awake_colocated_engine_stays_through_the_update():
    """cluster.engine_sleeps=false: the fast engine's weights, KV cache and activations sit beside the
    trainer's logprob passes and update, so those phases grow by exactly the engine's terms."""
    asleep = M.estimate(replace(BASE, gpu_bytes=80 * GIB))
    awake = M.estimate(replace(BASE, gpu_bytes=80 * GIB, engine_sleeps=False))
    engine = sum(M.engine_terms(replace(BASE, gpu_bytes=80 * GIB)).values())
    for phase in ("logprobs", "update"):
        assert sum(awake.phases[phase].values()) == sum(asleep.phases[phase].values()) + engine
    assert awake.phases["rollout"] == asleep.phases["rollout"]


def test_knobs_name_config_fields_for_the_largest_terms():
    m = replace(BASE, micro_batch_tokens=10**6)
    est = M.estimate(m)
    tips = M.knobs(m, est)
    assert "train.max_tokens_per_micro_batch" in tips[0] and "gradient_checkpointing" in tips[0]


@pytest.mark.parametrize(
    ("shape", "tokens", "chunk", "measured_gib"),
    [
        (qwen_shape(896, 4864, 24, 14), 16384, 1024, 10.23),
        (qwen_shape(896, 4864, 24, 14), 24576, 1024, 11.24),
        (qwen_shape(1536, 8960, 28, 12), 24576, 2048, 30.32),
    ],
)
def test_update_peak_within_15_percent_of_the_h100_measurements(shape, tokens, chunk, measured_gib):
    """BENCHMARKS.md, current figures: bench/e2e.py, 768-token sequences, 512 response tokens, grad ckpt,
    compiled trainer, fp32 masters + bf16. The update is the peak phase there."""
    seqs = tokens // 768
    m = M.MemoryInputs(shape, 2, True, True, "varlen", seqs * 768, seqs * 512, chunk)
    ratio = M.estimate(m).total("update") / GIB / measured_gib
    assert 1.0 <= ratio < 1.05


def test_moe_holds_every_expert_and_activates_k():
    """Qwen3-30B-A3B's shape: 128 experts of width 768, 8 a token, in 48 layers."""
    moe = replace(
        qwen_shape(2048, 6144, 48, 32, kv=4),
        experts=128,
        experts_per_token=8,
        expert_intermediate=768,
        moe_layers=48,
    )
    assert moe.active_params == moe.params - 48 * 120 * 3 * 2048 * 768
    m = replace(BASE, shape=moe)
    assert M.weight_bytes(m) == 4 * moe.params  # all experts are held (and trained)
    dense_width = replace(moe, experts=0)  # the dense MLP of the same width, 8 x 768 = 6144
    assert (
        M.layer_working_set(m, 10)
        == M.layer_working_set(replace(m, shape=dense_width), 10) + 10 * 2 * 8 * 2048 * 2
    )


def test_sequence_parallel_divides_a_ranks_activations_and_turns_a_plan_that_does_not_fit_into_one():
    """A 7B Qwen2.5 shape, one 32k-token micro-batch, FSDP over 4 ranks, on 48 GiB GPUs: alone each rank
    holds the whole row and does not fit; 4 ranks sharing it (train.sequence_parallel=4) do."""
    from ascent.doctor import plan

    seven_b = qwen_shape(3584, 18944, 28, 28, kv=4, vocab=152064)
    m = M.MemoryInputs(
        shape=seven_b,
        gradient_checkpointing=True,
        micro_batch_tokens=32768,
        response_tokens=16384,
        fsdp_ranks=4,
        colocated=False,
        gpu_bytes=48 * GIB,
    )
    sp = replace(m, sequence_parallel=4)
    assert M.body_activation_bytes(sp, 32768) == pytest.approx(M.body_activation_bytes(m, 32768) / 4)
    assert M.rank_tokens(replace(m, sequence_parallel=3), 10) == 4
    alone, shared = (
        plan.check_memory(m, M.estimate(m), "48 GiB"),
        plan.check_memory(sp, M.estimate(sp), "48 GiB"),
    )
    assert alone.status == "fail" and "train.sequence_parallel" in alone.fix
    assert shared.status == "ok" and "each rank holds 8,192 of a micro-batch's 32,768 tokens" in shared.detail


def test_a_colocated_kv_cache_is_capped_at_wake_by_the_trainer_state_with_its_adam_moments():
    """A 3B Qwen2.5 shape, full fine-tuning, colocated, rollout.gpu_memory_fraction=0.5: the engine wakes
    beside fp32 masters and AdamW's moments (`ascent.rollout.fast.pool`). On 64 GiB its cache runs smaller
    than asked (warn), on 44 GiB not even one request of its 32k context fits (fail), and offloading the
    optimizer gives it the asked size back (ok)."""
    from ascent.doctor import plan

    three_b = replace(qwen_shape(2048, 11008, 36, 16), context=32768)
    m = M.MemoryInputs(shape=three_b, gradient_checkpointing=True, gpu_bytes=64 * GIB)
    est = M.estimate(m)
    state = sum(M.trainer_state(m, with_grads=False).values())
    assert M.optimizer_bytes(m) > 0 and est.kv_cache < est.kv_asked
    held = M.CUDA_CONTEXT + M.engine_weight_bytes(m) + M.engine_reserve_bytes(m) + state
    assert est.kv_cache == 64 * GIB - held and est.phases["rollout"]["KV cache"] == est.kv_cache
    capped = plan.check_memory(m, est, "64 GiB")
    assert capped.status == "warn" and "AdamW moments" in capped.detail
    assert "train.offload_optimizer=true" in capped.fix and "rollout.gpu_memory_fraction" in capped.fix
    small = replace(m, gpu_bytes=44 * GIB)
    assert M.kv_wake_bytes(small) < M.kv_floor_bytes(small) < M.kv_cache_bytes(small)
    none = plan.check_memory(small, M.estimate(small), "44 GiB")
    assert none.status == "fail" and "KVCacheOutOfMemory" in none.detail and "32,768-token" in none.detail
    offloaded = replace(m, offload_optimizer=True)
    est = M.estimate(offloaded)
    assert est.kv_cache == est.kv_asked
    assert plan.check_memory(offloaded, est, "64 GiB").status == "ok"
    split = replace(m, colocated=False)
    assert M.kv_wake_bytes(split) == M.kv_cache_bytes(split)  # its own GPU: the asked size fits


def test_recompute_is_flagged_only_where_the_run_fits_without_it():
    """The 1.5B update of BENCHMARKS.md ("the update without recomputation"): at 16,384 tokens per
    micro-batch the estimate without checkpointing (65.5 GiB, 62.9 measured on an H200) fits a 141 GiB
    card, so the doctor says the recomputation buys nothing; on a 40 GiB card it is needed."""
    from ascent.doctor import plan

    shape = qwen_shape(1536, 8960, 28, 12)
    m = M.MemoryInputs(
        shape=shape,
        compute_bytes=2,
        micro_batch_tokens=21 * 768,
        response_tokens=21 * 512,
        logprob_chunk=2048,
        gradient_checkpointing=True,
        engine="fast",  # asleep through the update
        gpu_memory_fraction=0.3,
        gpu_bytes=int(139.8 * GIB),
    )
    big = plan.check_recompute(m, "NVIDIA H200")
    assert big is not None and big.status == "warn" and "gradient_checkpointing=false" in big.fix
    assert 55 * GIB < big.data["peak_bytes_without"] < 75 * GIB
    small = plan.check_recompute(replace(m, gpu_bytes=40 * GIB), "a 40 GiB GPU")
    assert small is not None and small.status == "ok" and "needed" in small.detail
    assert plan.check_recompute(replace(m, gradient_checkpointing=False), "x") is None


def test_kept_logits_are_suggested_only_where_they_fit():
    """train.keep_head_logits off: the doctor names it where the estimate with the kept [M, V] logits still
    fits (0.5B at 24576-token micro-batches: 4.6 GiB more, as measured on an H200); silent where it would not
    fit, where it is already on, and off a GPU."""
    from ascent.doctor import plan

    m = M.MemoryInputs(
        shape=qwen_shape(896, 4864, 24, 14),
        compute_bytes=2,
        micro_batch_tokens=32 * 768,
        response_tokens=32 * 512,
        logprob_chunk=1024,
        gpu_memory_fraction=0.3,
        gpu_bytes=int(139.8 * GIB),
    )
    hint = plan.check_kept_logits(m, "NVIDIA H200")
    assert hint is not None and hint.status == "ok" and "train.keep_head_logits=true" in hint.detail
    kept_extra = M.head_bytes(replace(m, keep_head_logits=True)) - M.head_bytes(m)
    assert 4.5 * GIB < kept_extra < 4.8 * GIB
    tight = replace(m, gpu_bytes=hint.data["peak_bytes_kept"])  # fits the peak, not the fragmentation margin
    assert plan.check_kept_logits(tight, "x") is None
    assert plan.check_kept_logits(replace(m, keep_head_logits=True), "x") is None
    assert plan.check_kept_logits(replace(m, gpu_bytes=0), "x") is None
