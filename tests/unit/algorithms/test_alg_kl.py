"""KL estimators, the straight-through variants, the reward penalty and the coefficient controllers."""

import math

import pytest
import torch

from ascent.algorithms import KL_ESTIMATORS, AdaptiveKLController, FixedKLController, kl_penalty_rewards


def test_hand_computed_values():
    logp = torch.tensor([0.0])
    ref = torch.tensor([math.log(0.5)])  # x = ref - logp = -log 2
    l2 = math.log(2.0)
    assert KL_ESTIMATORS["k1"](logp, ref).item() == pytest.approx(l2)
    assert KL_ESTIMATORS["k2"](logp, ref).item() == pytest.approx(0.5 * l2**2)
    assert KL_ESTIMATORS["k3"](logp, ref).item() == pytest.approx(0.5 + l2 - 1.0)
    assert KL_ESTIMATORS["k1+"](logp, ref).item() == pytest.approx(l2)
    assert KL_ESTIMATORS["k3+"](logp, ref).item() == pytest.approx(0.5 + l2 - 1.0)


@pytest.mark.parametrize("name", ["k1+", "k3+"])
def test_straight_through_gradient_equals_k2(name):
    ref = torch.tensor([-1.0, -0.2, -3.0, 0.0])
    logp = torch.tensor([-0.5, -0.9, -1.0, 0.0], requires_grad=True)
    (g,) = torch.autograd.grad(KL_ESTIMATORS[name](logp, ref).sum(), logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    (g2,) = torch.autograd.grad(KL_ESTIMATORS["k2"](logp2, ref).sum(), logp2)
    torch.testing.assert_close(g, g2)
    torch.testing.assert_close(g, logp.detach() - ref)


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_extreme_log_ratios_finite(name):
    logp = torch.tensor([50.0, -50.0, 0.0], requires_grad=True)
    ref = torch.tensor([-50.0, 50.0, 0.0])
    kl = KL_ESTIMATORS[name](logp, ref)
    (g,) = torch.autograd.grad(kl.sum(), logp)
    assert torch.isfinite(kl).all() and torch.isfinite(g).all()
    assert kl[2].item() == 0.0


def test_k3_clamped_and_nonnegative():
    kl = KL_ESTIMATORS["k3"](torch.tensor([-50.0, 0.3, -0.3]), torch.tensor([50.0, 0.0, 0.0]))
    assert kl[0].item() == 10.0
    assert (kl >= 0).all()


def test_kl_penalty_rewards():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    out = kl_penalty_rewards(logp, ref, mask, coef=0.1, estimator="k1")
    torch.testing.assert_close(out, torch.tensor([[-0.05, 0.0, 0.0]]))
    out3 = kl_penalty_rewards(logp, ref, mask, coef=0.1, estimator=KL_ESTIMATORS["k3"])
    assert out3[0, 0] < 0 and not out3.requires_grad


def test_adaptive_controller_rule():
    c = AdaptiveKLController(init_coef=0.2, target=6.0, horizon=10000)
    c.update(current_kl=12.0, n_steps=256)  # error clipped to +0.2
    assert c.coef == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000))
    before = c.coef
    c.update(current_kl=5.4, n_steps=100)  # error = -0.1
    assert c.coef == pytest.approx(before * (1 - 0.1 * 100 / 10000))
    c.update(current_kl=0.0, n_steps=100)  # error clipped to -0.2
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=10)


def test_fixed_controller():
    c = FixedKLController(0.05)
    c.update(100.0, 1000)
    assert c.coef == 0.05
