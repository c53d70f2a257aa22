"""Policy losses against hand-computed values, gradients and extreme inputs."""

import math

import pytest
import torch

from ascent.algorithms import (
    POLICY_LOSSES,
    cispo_loss,
    gspo_loss,
    options_for,
    ppo_loss,
    reinforce_loss,
    sapo_loss,
)


def leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def grad_of(loss, x):
    (g,) = torch.autograd.grad(loss.sum(), x)
    return g


def test_ppo_hand_computed_with_asymmetric_and_dual_clip():
    ratios = torch.tensor([1.5, 0.5, 5.0, 1.0, 1.1])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0])
    logp = leaf(ratios.log().tolist())
    old = torch.zeros(5)
    mask = torch.ones(5)
    loss, m = ppo_loss(
        logp,
        old,
        adv,
        mask,
        torch.zeros(5, dtype=torch.long),
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        dual_clip_c=3.0,
    )
    # 1.5 A>0 -> clipped at 1.28; 0.5 A<0 -> clipped at 0.8; 5 A<0 -> unclipped 5, dual cap 3; 1 -> -1; 1.1 ->
    # -1.1
    torch.testing.assert_close(loss, torch.tensor([-1.28, 0.8, 3.0, -1.0, -1.1]))
    torch.testing.assert_close(m["clipfrac"], torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(m["ratio"], ratios)
    # Clipped tokens get no gradient; unclipped: d(-A r)/dlogp = -A r.
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([0.0, 0.0, 0.0, -1.0, -1.1]))


def test_ppo_approx_kl_is_k3_of_old_vs_new():
    logp = torch.tensor([math.log(2.0)])
    _, m = ppo_loss(logp, torch.zeros(1), torch.ones(1), torch.ones(1), torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(m["approx_kl"], torch.tensor([2.0 - 1.0 - math.log(2.0)]))


def test_gspo_sequence_ratio_and_token_gradient():
    # seq 0: log-ratios 0.1, 0.3 -> s = exp(0.2); seq 1: log-ratio -0.4 -> s = exp(-0.4). Token 2 is masked.
    logp = leaf([0.1, 0.3, 7.0, -0.4])
    old = torch.zeros(4)
    adv = torch.tensor([2.0, 2.0, 2.0, -1.0])
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    seq = torch.tensor([0, 0, 0, 1])
    loss, m = gspo_loss(logp, old, adv, mask, seq, gspo_clip_low=0.9, gspo_clip_high=10.0)
    s0, s1 = math.exp(0.2), math.exp(-0.4)
    torch.testing.assert_close(m["ratio"], torch.tensor([s0, s0, 0.0, s1]))
    torch.testing.assert_close(loss, torch.tensor([-2 * s0, -2 * s0, 0.0, s1]))
    # Stop-gradient trick: d L_t / d logp_t = -A_i s_i (not the token ratio).
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([-2 * s0, -2 * s0, 0.0, s1]))


def test_gspo_default_small_clip_clips_whole_sequence():
    logp = leaf([0.1, 0.3])
    loss, m = gspo_loss(logp, torch.zeros(2), torch.ones(2), torch.ones(2), torch.zeros(2, dtype=torch.long))
    torch.testing.assert_close(loss, torch.full((2,), -(1 + 4e-4)))
    torch.testing.assert_close(m["clipfrac"], torch.ones(2))
    assert torch.equal(grad_of(loss, logp), torch.zeros(2))


def test_cispo_clips_weight_not_gradient():
    logp = leaf([math.log(2.0), math.log(0.5)])
    adv = torch.tensor([1.0, -2.0])
    loss, m = cispo_loss(
        logp, torch.zeros(2), adv, torch.ones(2), torch.zeros(2, dtype=torch.long), cispo_eps_high=0.28
    )
    torch.testing.assert_close(loss, torch.tensor([-1.28 * math.log(2.0), -0.5 * -2.0 * math.log(0.5)]))
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([-1.28, 1.0]))
    torch.testing.assert_close(m["clipfrac"], torch.tensor([1.0, 0.0]))


def test_sapo_gate_formula():
    # r = 1: loss = -(4/tau) * 0.5 * A and gradient -A (w(1) = 1).
    logp = leaf([0.0, 0.0, math.log(2.0)])
    adv = torch.tensor([1.0, -1.0, 1.0])
    loss, m = sapo_loss(
        logp,
        torch.zeros(3),
        adv,
        torch.ones(3),
        torch.zeros(3, dtype=torch.long),
        sapo_tau_pos=1.0,
        sapo_tau_neg=1.05,
    )
    sig = 1 / (1 + math.exp(-1.0))  # sigmoid(tau (r - 1)) at r = 2, tau = 1
    torch.testing.assert_close(loss, torch.tensor([-2.0, 2.0 / 1.05, -4.0 * sig]))
    w2 = 4 * sig * (1 - sig)
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([-1.0, 1.0, -w2 * 2.0]))
    torch.testing.assert_close(m["gate"], torch.tensor([1.0, 1.0, w2]))


def test_reinforce_is_minus_advantage_times_logp():
    logp = leaf([-1.0, -2.0])
    loss, _ = reinforce_loss(
        logp,
        torch.zeros(2),
        torch.tensor([0.5, -1.0]),
        torch.tensor([1.0, 0.0]),
        torch.zeros(2, dtype=torch.long),
    )
    torch.testing.assert_close(loss, torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([-0.5, 0.0]))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_extreme_log_ratios_stay_finite(name):
    logp = leaf([50.0, -50.0, 50.0, -50.0, 0.0, float("nan")])
    old = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1e4, float("inf")])
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    seq = torch.tensor([0, 1, 2, 3, 4, -1])
    fn = POLICY_LOSSES[name]
    loss, metrics = fn(logp, old, adv, mask, seq, **options_for(fn, {"dual_clip_c": 3.0}))
    assert torch.isfinite(loss).all()
    assert torch.isfinite(grad_of(loss, logp)).all()
    for k, v in metrics.items():
        assert v.shape == (6,) and torch.isfinite(v).all(), k
        assert not v.requires_grad
    assert loss[5] == 0


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_fully_masked_and_refuses_options_it_does_not_name(name):
    logp = leaf([0.3, -0.2])
    args = (logp, torch.zeros(2), torch.ones(2), torch.zeros(2), torch.zeros(2, dtype=torch.long))
    loss, _ = POLICY_LOSSES[name](*args)
    assert torch.equal(loss.detach(), torch.zeros(2))
    assert torch.equal(grad_of(loss, logp), torch.zeros(2))
    with pytest.raises(TypeError, match="gamma"):  # the builder hands a loss only its own options
        POLICY_LOSSES[name](*args, gamma=0.5)


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo", "sapo"])
def test_on_policy_gradient_equals_reinforce(name):
    # At ratio 1 every loss has gradient -A grad logp (per token, before aggregation).
    logp = leaf([-0.5, -1.5, -0.7])
    adv = torch.tensor([1.0, -2.0, 0.5])
    args = (logp.detach(), adv, torch.ones(3), torch.tensor([0, 0, 1]))
    loss, _ = POLICY_LOSSES[name](logp, *args)
    torch.testing.assert_close(grad_of(loss, logp), -adv)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_a_masked_token_with_a_huge_log_ratio_changes_nothing(name):
    """A tool token (mask 0) inside a sequence: whatever its old logprob (GSPO's sequence ratio averages the
    sampled tokens only), the loss and gradient of the sampled tokens are unchanged and its own are 0."""
    logp = leaf([-1.0, -0.5, -2.0, -1.2])
    adv = torch.tensor([1.0, 1.0, 1.0, -0.5])
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    seq = torch.tensor([0, 0, 0, 1])
    old = torch.tensor([-1.1, -0.45, -2.0, -1.0])
    fn = POLICY_LOSSES[name]
    base, _ = fn(logp, old, adv, mask, seq)
    base_grad = grad_of(base, logp)
    for gap in (-40.0, 40.0):
        loss, _ = fn(logp, old.clone().index_fill_(0, torch.tensor([2]), gap), adv, mask, seq)
        torch.testing.assert_close(loss, base, rtol=0, atol=0)
        torch.testing.assert_close(grad_of(loss, logp), base_grad, rtol=0, atol=0)
        assert loss[2] == 0
