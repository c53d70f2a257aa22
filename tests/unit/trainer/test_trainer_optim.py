"""AdamW construction, the warm-up + constant/cosine learning-rate schedule, and the step (skipped on a
non-finite gradient norm, or not taken at all)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ascent.trainer.optim import build_optimizer, build_scheduler, lr_factor, optimizer_step


def _lrs(steps, **kw):
    model = nn.Linear(2, 2)
    opt = build_optimizer(model, lr=0.1)
    sched = build_scheduler(opt, total_steps=steps, **kw)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_constant_with_warmup():
    assert _lrs(6, warmup_steps=3) == pytest.approx([0.1 / 3, 0.2 / 3, 0.1, 0.1, 0.1, 0.1])


def test_constant_without_warmup():
    assert _lrs(3) == pytest.approx([0.1, 0.1, 0.1])


def test_cosine_reaches_floor_on_last_step():
    lrs = _lrs(7, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    # steps 2..6 span the cosine: peak at step 2, floor (0.1 * lr) at the last step
    expected = [0.05, 0.1] + [0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4))) for k in range(5)]
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == pytest.approx(0.01)


def test_lr_factor_clamps_past_the_end():
    kw = {"warmup_steps": 0, "total_steps": 5, "schedule": "cosine", "min_lr_ratio": 0.2}
    assert lr_factor(100, **kw) == pytest.approx(0.2)


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="train.schedule='linear'"):
        build_scheduler(build_optimizer(nn.Linear(2, 2), lr=1.0), total_steps=3, schedule="linear")


def test_adamw_groups_decay_matrices_only_and_skip_frozen():
    model = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3), nn.Linear(3, 1))
    model[2].requires_grad_(False)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([3, 3])] and decay["weight_decay"] == 0.1
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0
    assert opt.defaults["foreach"] is True  # CPU: foreach, never fused


@pytest.mark.parametrize("grad", [float("nan"), float("inf"), 0.0])
def test_a_step_is_skipped_on_a_non_finite_norm_or_when_not_asked(grad):
    """A non-finite gradient norm skips the AdamW update (the schedule advances: a step was due); step=False
    (a mini-batch without a gradient to follow) moves nothing, the schedule included. After a first real
    step AdamW has momentum, so a taken step would move the weights even with a zero gradient."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = build_optimizer(model, lr=0.1, weight_decay=0.1)
    sched = build_scheduler(opt, total_steps=10)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    model(torch.ones(1, 3)).sum().backward()
    assert optimizer_step(opt, sched, scaler, model.parameters(), 1.0) == (pytest.approx(math.sqrt(8)), False)
    before = [p.detach().clone() for p in model.parameters()]
    moments = [t.clone() for s in opt.state.values() for t in s.values()]
    for p in model.parameters():
        p.grad = torch.full_like(p, grad)
    norm, skipped = optimizer_step(opt, sched, scaler, model.parameters(), 1.0, step=grad != 0.0)
    assert skipped == (not math.isfinite(grad)) and (norm == 0.0 or not math.isfinite(norm))
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    now = [t for s in opt.state.values() for t in s.values()]
    assert all(torch.equal(a, b) for a, b in zip(moments, now, strict=True))
    assert sched.last_epoch == (2 if skipped else 1)
