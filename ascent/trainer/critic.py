"""`CriticWorker`: the value model of PPO with GAE (design: "trainer/"), the sibling of `PolicyWorker`.

The controller calls, per iteration: `compute_values(samples)` (the critic's values of the rollout: the
`values` input of the `gae` estimator and the `old_values` of the value loss), then `update(mini_batch,
total_tokens=..., total_seqs=...)` once per critic optimizer step, and `save(dir)` / `load(dir)` next to the
policy's checkpoint (`<dir>/critic/`; the caller's staging directory makes it atomic).

Model. `ValueModel` = the decoder stack of a causal LM checkpoint (the policy's path, or a separate critic
checkpoint that shares the policy's tokenizer; its LM head is dropped) + `value_head = nn.Linear(H, 1)`
initialised to zeros. For a vision-language checkpoint (a VLA's critic) the stack is the multimodal backbone
(vision tower, merger, language model), fed each sequence's images and multimodal RoPE positions as the
policy's forward is (`ascent.trainer.logprobs.multimodal_forward`), so a value sees what the policy saw. Values are read from the hidden rows `packed.logit_index`, the positions that PREDICT
the response tokens (the rows of the policy's logprobs): value[t] = V(prompt + response[:t]), the state in
which token t is chosen. So the flat values [M] align 1:1 with response tokens and with the `returns` of
`gae`.

Loss. Per token `value_loss(values, old_values, returns, clip_range=value_clip)`, aggregated token-mean over
the loss-mask tokens with the mini-batch's GLOBAL `total_tokens`: each micro-batch (and worker) adds its
share, so the gradient does not depend on how the mini-batch is split. Missing `old_values` means on-policy
data (old = values, no clipping).

Precision and data parallelism follow `PolicyWorker`: fp32 master weights (`master_fp32`), forward under
`torch.autocast(dtype)`, a GradScaler for fp16, gradients SUMMED over workers (`ascent.trainer.distributed`),
`sharding="fsdp"` (FSDP2, lock-step forwards, `save` a collective) and `optim.offload` (AdamW on the CPU).
The value head always runs in fp32. No LoRA: the critic is trained in full.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import safetensors.torch as st
import torch
from torch import Tensor, nn

from ascent.algorithms import LOSS_AGGREGATIONS
from ascent.algorithms.value import value_clipfrac, value_loss
from ascent.messages import TrainSample
from ascent.models.loading import load_model, resolve_device, torch_dtype
from ascent.models.multimodal import is_vision_language, multimodal_backbone
from ascent.models.parallel import full_state_dict, has_shards, load_full_state_dict, load_shards, save_shards
from ascent.trainer import common
from ascent.trainer.distributed import all_reduce_sum
from ascent.trainer.logprobs import multimodal_forward, packed_forward, unwrap_model
from ascent.trainer.loss import MetricSums
from ascent.trainer.packing import PackedBatch, pack
from ascent.trainer.settings import CriticSpec, OptimSettings
from ascent.trainer.sharded import missing_micro_batches

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CRITIC_DIR = "critic"
WEIGHTS_FILE = "model.safetensors"


class ValueModel(nn.Module):
    """Decoder stack + scalar head: a packed micro-batch -> values [M] (fp32) of its response tokens."""

    def __init__(self, backbone: nn.Module, hidden_size: int, vision: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.vision = vision  # a vision-language backbone: images and multimodal positions go in
        param = next(backbone.parameters())
        self.value_head = nn.Linear(hidden_size, 1, device=param.device, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, packed: PackedBatch) -> Tensor:
        """input_ids, position_ids [1, N] -> values [M] read at `logit_index` (block-causal via positions).

        `attention_mask=None` and `use_cache=False` are both required for transformers to detect packing.
        """
        if self.vision:  # packed_positions reads the backbone (`.model`) and its config of a VL model
            positions_of = SimpleNamespace(model=self.backbone, config=self.backbone.config)
            full = multimodal_forward(positions_of, self.backbone, packed)
        else:
            full = packed_forward(self.backbone, packed)
        hidden = full.index_select(0, packed.logit_index)  # [M, H]
        with torch.autocast(hidden.device.type, enabled=False):
            return self.value_head(hidden.float()).squeeze(-1)


def load_value_model(
    path: str | Path, param_dtype: torch.dtype, device: torch.device, grad_ckpt: bool, remote: bool
) -> ValueModel:
    """A causal LM checkpoint -> ValueModel (its decoder stack, LM head dropped, zero value head)."""
    lm = unwrap_model(
        load_model(path, param_dtype, device, gradient_checkpointing=grad_ckpt, trust_remote_code=remote)
    )
    vision = is_vision_language(lm)  # its language model alone would read image pads without their images
    if vision:
        backbone: Any = multimodal_backbone(lm)
    else:
        backbone = lm.get_decoder() if hasattr(lm, "get_decoder") else getattr(lm, "model", None)
    if backbone is None:
        raise TypeError(f"{type(lm).__name__} at {str(path)!r}: expected a causal LM with get_decoder().")
    config = backbone.config
    hidden = getattr(config, "hidden_size", None) or config.get_text_config().hidden_size
    return ValueModel(backbone, hidden, vision).train()


class CriticWorker:
    """One critic process: value model, AdamW, LR schedule (see module doc)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str | torch.device = "auto",
        dtype: str = "fp32",
        master_fp32: bool = True,
        gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        optim: OptimSettings | None = None,
        value_clip: float | None = 0.2,
        max_tokens_per_micro_batch: int = 8192,
        parallelize: Callable[[nn.Module], nn.Module] | None = None,
        sharding: str = "none",
        seed: int | None = None,
    ) -> None:
        self.device = resolve_device(device)
        self.compute_dtype = torch_dtype(dtype)
        self.optim_settings = optim or OptimSettings(lr=1e-5)
        self.value_clip = value_clip
        self.max_tokens = max_tokens_per_micro_batch
        self.step = 0
        if seed is not None:
            torch.manual_seed(seed)
        param_dtype = torch.float32 if master_fp32 else self.compute_dtype
        self.value_model = load_value_model(
            model_path, param_dtype, self.device, gradient_checkpointing, trust_remote_code
        )
        self.model: nn.Module
        self.model, self.grads_synced_by_wrapper, self.sharded = common.wrap_model(
            self.value_model,
            parallelize,
            sharding,
            param_dtype=param_dtype,
            compute_dtype=self.compute_dtype,
            lora=False,
        )
        self.optimizer, self.scheduler, self.scaler = common.build_training(
            self.model, self.optim_settings, self.device, self.compute_dtype
        )

    @classmethod
    def from_spec(cls, spec: CriticSpec, device: torch.device | None = None, **kwargs: Any) -> CriticWorker:
        """Build from a `CriticSpec` (`device`: the one the rank resolved from `spec.device`)."""
        return cls(
            spec.model_path,
            device=spec.device if device is None else device,
            dtype=spec.dtype,
            gradient_checkpointing=spec.gradient_checkpointing,
            trust_remote_code=spec.trust_remote_code,
            optim=spec.optim,
            value_clip=spec.value_clip,
            max_tokens_per_micro_batch=spec.max_tokens_per_micro_batch,
            sharding=spec.sharding,
            **kwargs,
        )

    def _autocast(self) -> contextlib.AbstractContextManager:
        return common.autocast(self.device, self.compute_dtype)

    # ------------------------------------------------------------------------------------------ values
    @torch.no_grad()
    def compute_values(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """Per-response-token values of each sample, no grad, in input order (len = len(response_ids)).

        Samples are packed into micro-batches of at most `max_tokens_per_micro_batch` tokens.
        """
        with common.eval_mode(self.model), self._autocast(), self._oom_guard(samples):
            return common.forward_per_sample(self, samples, self.model, self.model, self.sharded)

    # ------------------------------------------------------------------------------------------ update
    def update(
        self, samples: Sequence[TrainSample], *, total_tokens: float, total_seqs: float
    ) -> dict[str, float]:
        """ONE optimizer step on this worker's share of a mini-batch; returns metrics over the whole of it.

        `total_tokens` (loss-mask tokens) and `total_seqs` are the mini-batch totals over ALL workers
        (`minibatch_totals`). Every sample needs `returns`. Metrics: critic/loss, critic/value_mean,
        critic/clipfrac, critic/explained_variance, critic/grad_norm, critic/lr, critic/skipped.
        """
        ev_sums = torch.zeros(5, dtype=torch.float64, device=self.device)

        def accumulate(micro: list[list[int]]) -> MetricSums:
            return self.accumulate(
                samples, micro, total_tokens=total_tokens, total_seqs=total_seqs, ev_sums=ev_sums
            )

        out, lr, grad_norm, skipped = common.run_update(self, samples, accumulate, self._oom_guard(samples))
        out.update(
            {
                "critic/explained_variance": explained_variance(all_reduce_sum(ev_sums)),
                "critic/grad_norm": grad_norm,
                "critic/lr": lr,
                "critic/skipped": float(skipped),
            }
        )
        return out

    def accumulate(
        self,
        samples: Sequence[TrainSample],
        micro_batches: Sequence[Sequence[int]],
        *,
        total_tokens: float,
        total_seqs: float,
        ev_sums: Tensor | None = None,
    ) -> MetricSums:
        """Forward + backward of each micro-batch (lists of sample indices); grads add up in .grad.

        `ev_sums` [5] float64, if given, accumulates the sums of `explained_variance` (this worker's).
        """
        metrics = MetricSums()
        fillers = missing_micro_batches(len(micro_batches), self.device, self.sharded)
        for idx in micro_batches:
            packed = pack([samples[i] for i in idx], self.device)
            returns = _require_returns(packed, idx)
            with self._autocast():
                values = self.model(packed)
            old = packed.old_values if packed.old_values is not None else values.detach()
            per_token = value_loss(values, old, returns, clip_range=self.value_clip)
            mask = packed.loss_mask
            loss = LOSS_AGGREGATIONS["token-mean"](
                per_token, mask, packed.seq_ids, total_tokens=total_tokens, total_seqs=total_seqs
            )
            self.scaler.scale(loss).backward()
            count = mask.sum()
            clipped = value_clipfrac(values, old, returns, self.value_clip)
            metrics.add("critic/loss", loss)
            metrics.add("critic/value_mean", (values.detach() * mask).sum(), count)
            metrics.add("critic/clipfrac", (clipped * mask).sum(), count)
            if ev_sums is not None:
                ev_sums += explained_variance_sums(values.detach(), returns, mask)
        for _ in range(fillers):  # lock-step filler for FSDP: a zero-gradient forward + backward
            common.filler_backward(self, self.model)
        return metrics

    def _optimizer_step(self) -> tuple[float, bool]:
        """Unscale, clip (global norm), step optimizer and scheduler; skip the step on a non-finite norm."""
        return common.step_optimizer(self)

    def _oom_guard(self, samples: Sequence[TrainSample]) -> contextlib.AbstractContextManager:
        return common.oom_guard(
            self, samples, "critic", "use model.dtype=bf16, or use a smaller critic checkpoint."
        )

    # ------------------------------------------------------------------------------------ checkpoints
    def save(self, directory: str | Path, optimizer: bool = True, hf_weights: bool = True) -> None:
        """Write `<directory>/critic/`: model.safetensors (backbone + head), config.json, trainer_state.pt.

        Sharded (a collective): every rank writes its shards of the weights (`model_shards/`, the resume
        state) and of the optimizer (`optimizer_shards/`); rank 0 also writes the gathered weights when
        `hf_weights`. Any number of ranks, sharded or not, can load them.
        """
        out = Path(directory) / CRITIC_DIR
        out.mkdir(parents=True, exist_ok=True)
        if self.sharded:
            save_shards(self.value_model, out)
        weights = full_state_dict(self.value_model) if self.sharded and hf_weights else {}
        if not common.write_shard(self, out, optimizer):
            return  # rank 0 holds (or has gathered) the weights
        if self.sharded:
            if hf_weights:
                st.save_file({k: v.contiguous() for k, v in weights.items()}, str(out / WEIGHTS_FILE))
        else:
            st.save_model(self.value_model, str(out / WEIGHTS_FILE))
        backbone = cast("PreTrainedModel", self.value_model.backbone)  # an HF decoder stack
        backbone.config.save_pretrained(str(out))
        common.write_state(self, out, optimizer)

    def load(self, directory: str | Path) -> None:
        """Restore weights, optimizer, scheduler, scaler and step from `save(directory)` (RNG: the
        policy's)."""
        src = Path(directory) / CRITIC_DIR
        if has_shards(src):  # each rank reads the slices it holds, whatever number of ranks wrote them
            load_shards(self.value_model, src)
            common.load_state(self, src, rng=False)
            return
        if not (src / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"{str(src)!r} holds no critic ({WEIGHTS_FILE}); was it saved with one?")
        try:
            load_full_state_dict(self.value_model, st.load_file(str(src / WEIGHTS_FILE)))
        except ValueError as e:
            raise ValueError(f"{str(src)!r}: critic weights do not match: {e}") from e
        common.load_state(self, src, rng=False)


def _require_returns(packed: PackedBatch, idx: Sequence[int]) -> Tensor:
    if packed.returns is None:
        raise ValueError(
            f"CriticWorker.update: samples {list(idx)} include one without `returns`; set "
            "TrainSample.returns from the advantage estimator's returns (advantage=gae) before updating the "
            "critic."
        )
    return packed.returns


def explained_variance_sums(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """values, returns, mask [M] -> float64 [5]: masked count, sum R, sum R^2, sum (R - V), sum (R - V)^2."""
    m = mask.double()
    r, d = returns.double(), (returns - values).double()
    return torch.stack([m.sum(), (m * r).sum(), (m * r * r).sum(), (m * d).sum(), (m * d * d).sum()])


def explained_variance(sums: Tensor) -> float:
    """sums [5] of `explained_variance_sums` (over micro-batches and workers) -> 1 - Var(R - V) / Var(R).

    NaN when there are no tokens or Var(R) = 0 (every return equal).
    """
    n, sr, sr2, sd, sd2 = (float(x) for x in sums.cpu())
    if n <= 0:
        return float("nan")
    var_r = sr2 / n - (sr / n) ** 2
    var_d = sd2 / n - (sd / n) ** 2
    return 1.0 - var_d / var_r if var_r > 1e-12 else float("nan")
