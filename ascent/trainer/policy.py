"""`PolicyWorker`: the state and the update of one trainer process (design: "One controller, plain workers").

The controller calls, per iteration: `compute_logprobs(samples, T)` (old logprobs; `which="reference"` for
the KL reference, `which="teacher"` for the distillation teacher; `compute_logprobs_and_sum_pi_squared` for
the optimal-token baseline), then `update(mini_batch, total_tokens=..., total_seqs=...)` once per optimizer step, then
`named_weights()` to publish the new policy to the rollout engine, and `save(dir)` / `load(dir)` for
checkpoints (`ascent.trainer.checkpoint` makes them atomic).

Precision. `dtype` is the COMPUTE dtype. With `master_fp32=True` (default) trainable weights, gradients and
AdamW moments are fp32; forward/backward run under `torch.autocast(dtype)` when dtype is bf16/fp16 (fp16 adds
a GradScaler). With `master_fp32=False` weights and optimizer state live in `dtype` (half the memory, less
exact updates). The frozen reference model (full fine-tuning with a KL loss) is held in `dtype`. With LoRA
the frozen base is held in `dtype`, the adapters in fp32 (peft), and the reference is the base itself
(adapters switched off), never a copy. A distillation teacher (`teacher_path`) is another frozen checkpoint,
held and run like the reference (in `dtype`, not sharded).

Data parallelism: each worker gets a shard of the mini-batch plus the GLOBAL totals, so its loss is its share
of the global loss and gradients are SUMMED over workers (`ascent.trainer.distributed`). With
`sharding="fsdp"` and several ranks the policy is sharded with FSDP2 (`ascent.models.parallel`): ranks run
forwards in lock-step (`ascent.trainer.sharded`), `named_weights`, `save` and `load` are collectives (call
them on every rank), and checkpoints hold weights and optimizer as DCP shards (`model_shards/`,
`optimizer_shards/`) that any number of ranks, sharded or not, can load. `optim.offload` keeps AdamW on the
CPU.

Vision-language policies (Qwen2.5-VL, Qwen3-VL) train the same way: samples carry their images, the forward
runs the vision tower (`ascent.trainer.logprobs`); `freeze_vision_tower` leaves the tower and merger out of
training, and LoRA adapters go to the language model (`ascent.trainer.lora`).

Mixture-of-experts policies (Qwen3-MoE) replay the sampler's experts: a sample's `routed_experts` make the
policy's routers use the experts the engine chose (`ascent.models.moe.RoutingReplay`), in the old-logprob
pass and in the update's forward and backward; the reference and the teacher route themselves.

Sequence parallelism (`sequence_parallel=N`, Ulysses): groups of N ranks pool their shares of the samples
and split every packed row between them (`ascent.trainer.sequence_parallel`); each rank returns the results
of the samples it was given, as without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ascent.messages import TrainSample
from ascent.models.action_head import (
    ActionHeadSpec,
    attach_action_head,
)
from ascent.models.loading import compute_dtype, load_model, resolve_device
from ascent.models.moe import RoutingReplay, is_moe
from ascent.models.multimodal import freeze_vision
from ascent.models.parallel import (
    full_parameters,
)
from ascent.trainer import common, lora_sharded
from ascent.trainer import lora as lora_lib
from ascent.trainer.checkpoint import rng_state, set_rng_state
from ascent.trainer.common import TrainerOutOfMemory
from ascent.trainer.compiled import compile_decoder_layers, compile_enabled
from ascent.trainer.logprobs import token_logprobs, token_logprobs_and_sum_pi_squared, unwrap_model
from ascent.trainer.loss import LossSettings, MetricSums, micro_batch_loss
from ascent.trainer.packing import PackedBatch, pack
from ascent.trainer.policy_checkpoint import load_policy, save_policy
from ascent.trainer.sequence_parallel import gather_samples
from ascent.trainer.sequence_parallel import setup as setup_sequence_parallel
from ascent.trainer.settings import LoraSettings, OptimSettings, TrainerSpec
from ascent.trainer.sharded import missing_micro_batches

__all__ = ["PolicyWorker", "TrainerOutOfMemory"]

_OOM_ADVICE = (
    "lower train.logprob_chunk_tokens, use model.dtype=bf16, use LoRA (model.lora.rank > 0), or add trainer "
    "GPUs (cluster.num_trainer_workers)."
)


class PolicyWorker:
    """One trainer process: policy model, optimizer, LR schedule, optional frozen reference (see module
    doc)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str | torch.device = "auto",
        dtype: str = "fp32",
        master_fp32: bool = True,
        gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        freeze_vision_tower: bool = False,
        tokenizer_path: str | Path | None = None,
        lora: LoraSettings | None = None,
        optim: OptimSettings | None = None,
        loss: LossSettings | None = None,
        max_tokens_per_micro_batch: int = 8192,
        logprob_chunk_tokens: int = 1024,
        keep_head_logits: bool = False,
        temperature: float = 1.0,
        need_reference: bool | None = None,
        teacher_path: str | Path | None = None,
        parallelize: Callable[[nn.Module], nn.Module] | None = None,
        sharding: str = "none",
        compile: str = "off",
        sequence_parallel: int = 1,
        attention: str = "auto",
        seed: int | None = None,
        action_head: ActionHeadSpec | None = None,
    ) -> None:
        self.device = resolve_device(device)
        self.compute_dtype = compute_dtype(dtype, self.device)
        self.lora = lora if lora is not None and lora.rank > 0 else None
        self.optim_settings = optim or OptimSettings()
        self.loss_settings = loss or LossSettings()
        self.max_tokens = max_tokens_per_micro_batch
        self.chunk_tokens = logprob_chunk_tokens
        self.keep_head_logits = keep_head_logits
        self.temperature = temperature
        self.tokenizer_path = tokenizer_path or model_path
        self.model_path = model_path
        self.action_head = action_head
        self.step = 0
        if seed is not None:
            torch.manual_seed(seed)
        param_dtype = torch.float32 if master_fp32 and self.lora is None else self.compute_dtype
        self.model = self._load_policy(model_path, param_dtype, gradient_checkpointing, trust_remote_code)
        if freeze_vision_tower:
            freeze_vision(self.model)
        self.param_dtype = param_dtype
        self.model, self.grads_synced_by_wrapper, self.sharded = common.wrap_model(
            self.model,
            parallelize,
            sharding,
            param_dtype=param_dtype,
            compute_dtype=self.compute_dtype,
            lora=self.lora is not None,
        )
        moe = is_moe(unwrap_model(self.model))  # replays the sampler's experts (ascent.models.moe)
        self.routing = RoutingReplay(unwrap_model(self.model)) if moe else None
        self.reference = self._load_reference(model_path, need_reference, trust_remote_code)
        self.teacher = None if teacher_path is None else self._load_frozen(teacher_path, trust_remote_code)
        frozen = [m for m in (self.reference, self.teacher) if m is not None]
        self.sp = setup_sequence_parallel(  # `attention` picks its kernel (sequence parallelism only)
            sequence_parallel,
            [self.model, *frozen],
            device=self.device,
            compute_dtype=self.compute_dtype,
            attention=attention,
        )
        self.compiled = compile_enabled(compile, self.device)
        if self.compiled:  # fused elementwise work around the matmuls (see ascent.trainer.compiled)
            for m in (self.model, self.reference, self.teacher):
                if m is not None:
                    compile_decoder_layers(m)
        self.optimizer, self.scheduler, self.scaler = common.build_training(
            self.model, self.optim_settings, self.device, self.compute_dtype
        )

    @classmethod
    def from_spec(cls, spec: TrainerSpec, device: torch.device | None = None, **kwargs: Any) -> PolicyWorker:
        """Build from a `TrainerSpec` (`device`: the one the rank resolved from `spec.device`)."""
        return cls(
            spec.model_path,
            device=spec.device if device is None else device,
            dtype=spec.dtype,
            gradient_checkpointing=spec.gradient_checkpointing,
            trust_remote_code=spec.trust_remote_code,
            freeze_vision_tower=spec.freeze_vision_tower,
            tokenizer_path=spec.tokenizer_path,
            lora=spec.lora,
            optim=spec.optim,
            loss=spec.loss,
            max_tokens_per_micro_batch=spec.max_tokens_per_micro_batch,
            logprob_chunk_tokens=spec.logprob_chunk_tokens,
            keep_head_logits=spec.keep_head_logits,
            temperature=spec.temperature,
            need_reference=spec.need_reference,
            teacher_path=spec.teacher_path,
            sharding=spec.sharding,
            compile=spec.compile,
            sequence_parallel=spec.sequence_parallel,
            attention=spec.attention,
            action_head=spec.action_head,
            **kwargs,
        )

    # ----------------------------------------------------------------------------------------- loading
    def _load_policy(
        self, path: str | Path, param_dtype: torch.dtype, grad_ckpt: bool, remote: bool
    ) -> nn.Module:
        model = load_model(
            path, param_dtype, self.device, gradient_checkpointing=grad_ckpt, trust_remote_code=remote
        )
        if self.action_head is not None:  # its parameters join the policy's (ascent.models.action_head)
            attach_action_head(model, self.action_head, path)
        if self.lora is not None:
            lo = self.lora
            model = lora_lib.apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules)
        model.train()
        return model

    def _load_reference(self, path: str | Path, need: bool | None, remote: bool) -> nn.Module | None:
        need = self.loss_settings.kl_loss_coef > 0 if need is None else need
        if not need or self.lora is not None:
            return None  # with LoRA the reference is the policy with adapters disabled
        return self._load_frozen(path, remote)

    def _load_frozen(self, path: str | Path, remote: bool) -> nn.Module:
        """A frozen checkpoint in the compute dtype, in eval mode: the reference or the teacher."""
        ref = load_model(path, self.compute_dtype, self.device, trust_remote_code=remote)
        ref.requires_grad_(False)
        return ref.eval()

    # ----------------------------------------------------------------------------------------- forward
    def _autocast(self) -> contextlib.AbstractContextManager:
        return common.autocast(self.device, self.compute_dtype)

    def _reference_module(self) -> tuple[nn.Module, contextlib.AbstractContextManager]:
        if self.lora is not None:
            return self.model, lora_lib.reference_context(self.model)
        if self.reference is None:
            raise ValueError(
                "compute_logprobs(which='reference'): this worker has no reference model; build it with "
                "algorithm.kl_loss_coef > 0 or need_reference=True."
            )
        return self.reference, contextlib.nullcontext()

    def _scoring_module(self, which: str) -> tuple[nn.Module, contextlib.AbstractContextManager]:
        """The model `compute_logprobs(which=...)` runs, and the context it runs in."""
        if which == "policy":
            return self.model, contextlib.nullcontext()
        if which == "reference":
            return self._reference_module()
        if which == "teacher":
            if self.teacher is None:
                raise ValueError(
                    "compute_logprobs(which='teacher'): this worker has no teacher; build it with "
                    "teacher_path (advantage=distill with algorithm.teacher=<checkpoint>)."
                )
            return self.teacher, contextlib.nullcontext()
        raise ValueError(f"which={which!r}: use 'policy', 'reference' or 'teacher'.")

    @torch.no_grad()
    def compute_logprobs(
        self, samples: Sequence[TrainSample], temperature: float | None = None, which: str = "policy"
    ) -> list[list[float]]:
        """Per-response-token logprobs of each sample under the policy (or the reference, or the teacher),
        no grad.

        Samples are packed into micro-batches of at most `max_tokens_per_micro_batch` tokens; the result is
        in the input order, one list per sample (len = len(response_ids)).
        """
        model, ctx = self._scoring_module(which)
        temp, sp = self.temperature if temperature is None else temperature, self.sp
        pooled, start = (list(samples), 0) if sp is None else gather_samples(sp, samples)

        def forward(packed: PackedBatch) -> Tensor:
            chunk, compiled = self.chunk_tokens, self.compiled
            with self._replaying(packed, which == "policy"):
                lp = token_logprobs(
                    model, packed, temperature=temp, chunk_tokens=chunk, compiled=compiled, sp=sp
                )
            return lp[0]

        def filler(packed: PackedBatch) -> Any:
            return token_logprobs(model, packed, temperature=temp, sp=sp)

        with common.eval_mode(model), ctx, self._autocast(), self._oom_guard(samples):
            out = common.forward_per_sample(
                self,
                pooled,
                forward,
                filler,
                self.sharded and model is self.model,  # LoRA: ref = policy
            )
        return out[start : start + len(samples)]

    @torch.no_grad()
    def compute_logprobs_and_sum_pi_squared(
        self, samples: Sequence[TrainSample], temperature: float | None = None
    ) -> tuple[list[list[float]], list[list[float]]]:
        """(per-response-token logprobs under the policy, exactly `compute_logprobs`' values; Σ_v π_v² of each
        of those tokens' distributions), one forward, no grad: what the optimal-token baseline reads. Asked
        only by that estimator; every other run calls `compute_logprobs`."""
        temp, sp = self.temperature if temperature is None else temperature, self.sp
        pooled, start = (list(samples), 0) if sp is None else gather_samples(sp, samples)

        def forward(packed: PackedBatch) -> tuple[Tensor, Tensor]:
            chunk, compiled = self.chunk_tokens, self.compiled
            return token_logprobs_and_sum_pi_squared(
                self.model, packed, temperature=temp, chunk_tokens=chunk, compiled=compiled, sp=sp
            )

        def filler(packed: PackedBatch) -> Any:
            return token_logprobs_and_sum_pi_squared(self.model, packed, temperature=temp, sp=sp)

        with common.eval_mode(self.model), self._autocast(), self._oom_guard(samples):
            logprobs, sums = common.forward_per_sample_many(self, pooled, forward, filler, self.sharded, 2)
        end = start + len(samples)
        return logprobs[start:end], sums[start:end]

    # ------------------------------------------------------------------------------------------ update
    def update(
        self, samples: Sequence[TrainSample], *, total_tokens: float, total_seqs: float, step: bool = True
    ) -> dict[str, float]:
        """ONE optimizer step on this worker's share of a mini-batch; returns metrics averaged over it.

        `total_tokens` (loss-mask tokens) and `total_seqs` are the mini-batch totals over ALL workers
        (see `minibatch_totals`). Metrics: loss/policy, loss/kl, loss/total, entropy, clipfrac, approx_kl,
        ratio, grad_norm, lr, tokens, response_tokens, micro_batches, skipped (1 if the grad was not finite).
        `step=False` (the controller's call, the same on every rank: a mini-batch without a gradient to
        follow) computes the same metrics but leaves weights, optimizer, schedule and step count as they were.
        """
        if self.sp is not None:  # the group's ranks update on their pooled samples (module doc)
            samples = gather_samples(self.sp, samples)[0]
        out, lr, grad_norm, skipped = common.run_update(
            self,
            samples,
            lambda micro: self.accumulate(samples, micro, total_tokens=total_tokens, total_seqs=total_seqs),
            self._oom_guard(samples),
            step,
            None if self.sp is None else self.sp.reducers(),
        )
        out.update({"grad_norm": grad_norm, "lr": lr, "skipped": float(skipped)})
        return out

    def accumulate(
        self,
        samples: Sequence[TrainSample],
        micro_batches: Sequence[Sequence[int]],
        *,
        total_tokens: float,
        total_seqs: float,
    ) -> MetricSums:
        """Forward + backward of each micro-batch (lists of sample indices); grads add up in .grad."""
        metrics = MetricSums()
        settings = self.loss_settings
        max_len = settings.max_len or max((len(s.response_ids) for s in samples), default=1)
        want_entropy = True  # reported as a metric; it joins the loss only when entropy_coef != 0
        fillers = missing_micro_batches(len(micro_batches), self.device, self.sharded)
        for idx in micro_batches:
            packed = pack([samples[i] for i in idx], self.device)
            with self._replaying(packed), self._autocast():
                lp, ent = token_logprobs(
                    self.model,
                    packed,
                    temperature=self.temperature,
                    chunk_tokens=self.chunk_tokens,
                    with_entropy=want_entropy,
                    compiled=self.compiled,
                    entropy_grad=settings.entropy_coef != 0,
                    sp=self.sp,
                    keep_logits=self.keep_head_logits,
                )
            loss = micro_batch_loss(
                lp,
                ent,
                packed,
                settings,
                total_tokens=total_tokens,
                total_seqs=total_seqs,
                max_len=max_len,
                metrics=metrics,
            )
            with self._replaying(packed):  # the same experts again: activation checkpointing recomputes
                self.scaler.scale(loss).backward()
            one = packed.loss_mask.new_ones(())
            metrics.add("tokens", one * packed.num_tokens)
            metrics.add("response_tokens", packed.loss_mask.sum())
            metrics.add("micro_batches", one)
        for _ in range(fillers):
            self._filler_backward()
        return metrics

    def _replaying(self, packed: PackedBatch, policy: bool = True) -> contextlib.AbstractContextManager:
        """Routing replay of the packed row's recorded experts in the policy's MoE layers; a no-op for a
        dense policy, for the reference or the teacher (`policy=False`) and for rows without experts."""
        if self.routing is None or not policy or packed.routed_experts is None:
            return contextlib.nullcontext()
        return self.routing.replaying(packed.routed_experts)

    def _filler_backward(self) -> None:
        """A zero-gradient forward + backward that keeps this rank in lock-step with the others (FSDP)."""
        common.filler_backward(self, lambda packed: token_logprobs(self.model, packed, sp=self.sp)[0])

    def _optimizer_step(self) -> tuple[float, bool]:
        """Unscale, clip (global norm), step optimizer and scheduler; skip the step on a non-finite norm."""
        return common.step_optimizer(self)

    def _oom_guard(self, samples: Sequence[TrainSample]) -> contextlib.AbstractContextManager:
        return common.oom_guard(self, samples, "policy", _OOM_ADVICE)

    # --------------------------------------------------------------------------------- weights, state
    def named_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
        """(HF name, tensor) of the current policy for the rollout engine; LoRA is merged on the fly, or
        with `publish_adapter` only the adapter is sent (`adapter_weights`; `dtype` does not apply).

        Tied parameters appear once (e.g. `model.embed_tokens.weight`, not `lm_head.weight`). Tensors are
        detached views of live weights unless `dtype` asks for a cast; the consumer copies what it keeps.
        Sharded: full tensors gathered in buckets (cast before the gather), a collective: every rank must
        iterate to the end (ranks other than the publisher can drop what they get).
        """
        if self.lora is not None and self.lora.publish_adapter:
            yield from self.adapter_weights()
            return
        if self.sharded:
            if self.lora is not None:
                yield from lora_sharded.merged_full_weights(self.model, dtype)
            else:
                yield from full_parameters(unwrap_model(self.model), dtype)
            return
        items = lora_lib.merged_named_weights(self.model) if self.lora else self._plain_named_weights()
        for name, t in items:
            yield name, (t if dtype is None else t.to(dtype))

    def adapter_weights(self) -> Iterator[tuple[str, Tensor]]:
        """A LoRA policy's adapter-only publication (`lora.adapter_named_tensors`): every adapted layer's
        lora_A, lora_B and lora_scaling, which an engine merges into its own base weights (unsharded)."""
        if self.lora is None or self.sharded:
            raise ValueError("adapter_weights: an unsharded LoRA policy publishes its adapter only.")
        yield from lora_lib.adapter_named_tensors(self.model)

    def _plain_named_weights(self) -> Iterator[tuple[str, Tensor]]:
        for name, p in unwrap_model(self.model).named_parameters():
            yield name, p.detach()

    def rng_state(self) -> dict[str, Any]:
        return rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state)

    def save(self, directory: str | Path, optimizer: bool = True, hf_weights: bool = True) -> None:
        """Write HF weights (merged for LoRA when `save_merged`), the adapter, tokenizer, trainer_state.pt
        (`ascent.trainer.policy_checkpoint.save_policy`; sharded runs: a collective)."""
        save_policy(self, Path(directory), optimizer, hf_weights)

    def load(self, directory: str | Path) -> None:
        """Restore weights (adapter for LoRA), optimizer, scheduler, scaler, step and RNG from `save(dir)`
        (`ascent.trainer.policy_checkpoint.load_policy`; sharded runs: a collective)."""
        load_policy(self, Path(directory))
