"""AdamW with its state on the CPU (`train.offload_optimizer`), for models whose optimizer does not fit.

Full fine-tuning with AdamW keeps, per parameter, the weight, its gradient and two fp32 moments: 16 bytes
per parameter with fp32 masters, 12 of them needed only inside `optimizer.step()`. `OffloadedAdamW` keeps
an fp32 CPU master copy of every (local shard of a) parameter plus the moments on the CPU; the device holds
only the weights and gradients. One step:

    grads  device -> CPU (pinned buffers)  ->  AdamW step on the CPU masters  ->  masters CPU -> device

Its `param_groups` hold the DEVICE parameters, so LR schedules, gradient clipping and the fp16 GradScaler
work unchanged; the hyperparameters are copied to the CPU AdamW before each step. Sharded parameters
(DTensors of FSDP2) are handled through their local shards: each rank offloads only its shard. The result
equals on-device AdamW in fp32 up to the order of floating-point operations of the CPU kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

_HPARAMS = ("lr", "betas", "eps", "weight_decay", "initial_lr")


def _local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (aliases its storage under no_grad), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def _cpu_buffer(like: Tensor, pin: bool) -> Tensor:
    return torch.empty(_local(like).shape, dtype=torch.float32, device="cpu", pin_memory=pin)


class OffloadedAdamW(torch.optim.Optimizer):
    """AdamW over device parameters whose moments and fp32 master weights live on the CPU (see module doc)."""

    def __init__(
        self,
        params: Iterable[Any],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        device_params = [p for g in self.param_groups for p in g["params"]]
        self._pin = any(p.is_cuda for p in device_params)
        self._grads = [[_cpu_buffer(p, self._pin) for p in g["params"]] for g in self.param_groups]
        masters = [[_cpu_buffer(p, self._pin) for p in g["params"]] for g in self.param_groups]
        inner = [{"params": m, **self._hparams(g)} for g, m in zip(self.param_groups, masters, strict=True)]
        self.cpu_adamw = torch.optim.AdamW(inner, lr=lr, betas=betas, eps=eps, foreach=True)
        self.refresh_masters()

    @staticmethod
    def _hparams(group: dict[str, Any]) -> dict[str, Any]:
        return {k: group[k] for k in _HPARAMS if k in group}

    def _pairs(self) -> Iterable[tuple[dict[str, Any], dict[str, Any], list[Tensor]]]:
        return zip(self.param_groups, self.cpu_adamw.param_groups, self._grads, strict=True)

    @torch.no_grad()
    def refresh_masters(self) -> None:
        """Copy the device parameters into the CPU masters (after loading new weights into the model)."""
        for group, inner, _ in self._pairs():
            for p, master in zip(group["params"], inner["params"], strict=True):
                master.copy_(_local(p))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """grads -> CPU, AdamW on the CPU masters, masters -> the device parameters."""
        if closure is not None:
            raise ValueError("OffloadedAdamW.step does not take a closure.")
        for group, inner, buffers in self._pairs():
            inner.update(self._hparams(group))
            for p, master, buf in zip(group["params"], inner["params"], buffers, strict=True):
                master.grad = None if p.grad is None else buf.copy_(_local(p.grad), non_blocking=True)
        if self._pin:
            torch.cuda.synchronize()  # the D2H grad copies must land before the CPU step reads them
        self.cpu_adamw.step()
        for group, inner, _ in self._pairs():
            for p, master in zip(group["params"], inner["params"], strict=True):
                _local(p).copy_(master, non_blocking=True)
        self._alias_state()

    def _alias_state(self) -> None:
        """`self.state[device param]` is the CPU AdamW's state of its master (the same dict), so code that
        asks whether the optimizer has state (torch's `get_optimizer_state_dict`) sees it."""
        for group, inner, _ in self._pairs():
            for p, master in zip(group["params"], inner["params"], strict=True):
                if master in self.cpu_adamw.state:
                    self.state[p] = self.cpu_adamw.state[master]

    def state_dict(self) -> dict[str, Any]:
        """The CPU AdamW's state dict, with the current hyperparameters (lr after the schedule) in its groups.

        The moments of a sharded (DTensor) parameter are DTensors too, over its CPU shard, so that
        torch.distributed.checkpoint knows which slice of the whole each rank holds.
        """
        for group, inner, _ in self._pairs():
            inner.update(self._hparams(group))
        sd = self.cpu_adamw.state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        sd["state"] = {i: {k: _like(v, params[i]) for k, v in s.items()} for i, s in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore moments and hyperparameters; the masters are re-read from the (already loaded) weights."""
        state = {i: {k: _local(v) for k, v in s.items()} for i, s in state_dict["state"].items()}
        self.cpu_adamw.load_state_dict({**state_dict, "state": state})
        for group, inner, _ in self._pairs():
            group.update(self._hparams(inner))
        self.refresh_masters()
        self.state.clear()
        self._alias_state()


def _like(value: Any, param: Tensor) -> Any:
    """A CPU moment of `param`'s local shard as a DTensor laid out like `param` (else `value` itself)."""
    if not isinstance(param, DTensor) or not isinstance(value, Tensor) or value.dim() == 0:
        return value
    return DTensor.from_local(
        value, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )
