"""GMPO, DRO, Clip-Cov and KL-Cov on hand-computed tokens: values, gradients and the tokens they select."""

import math

import torch

from ascent.algorithms import LOSS_AGGREGATIONS, clip_cov_loss, dro_loss, gmpo_loss, kl_cov_loss


def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def seq_mean_token_mean(loss, mask, seq):
    return LOSS_AGGREGATIONS["seq-mean-token-mean"](loss, mask, seq, total_seqs=int(seq.max()) + 1)


def test_gmpo_geometric_mean_of_sign_clipped_ratios():
    # seq 0 (A = 1): log-ratios [0.1, 0.6] -> [0.1, 0.4] (upper clip 0.4): s = e^0.25, L = -e^0.25, and only
    # the unclipped token gets a gradient: dL/dlogp = -s / 2 (the token mean over 2 tokens).
    # seq 1 (A = -1): log-ratios [-0.6, 0.2] -> [-0.4, 0.2] (lower clip): s = e^-0.1, L = +e^-0.1.
    old = t(-1.0, -1.0, -1.0, -1.0)
    logp = (old + t(0.1, 0.6, -0.6, 0.2)).requires_grad_(True)
    adv, mask, seq = t(1.0, 1.0, -1.0, -1.0), torch.ones(4), torch.tensor([0, 0, 1, 1])
    loss, metrics = gmpo_loss(logp, old, adv, mask, seq)
    s0, s1 = math.exp(0.25), math.exp(-0.1)
    torch.testing.assert_close(loss.detach(), t(-s0, -s0, s1, s1))
    torch.testing.assert_close(metrics["clipfrac"], t(0.0, 1.0, 1.0, 0.0))
    torch.testing.assert_close(metrics["ratio"], t(s0, s0, s1, s1))
    seq_mean_token_mean(loss, mask, seq).backward()
    torch.testing.assert_close(logp.grad, t(-s0 / 4, 0.0, 0.0, s1 / 4))  # / 2 tokens / 2 sequences


def test_gmpo_uses_the_sequence_mean_advantage_and_ignores_the_other_side():
    # A > 0 with a log-ratio below -0.4 is not clipped (clipping it would raise the objective).
    old = t(-1.0, -1.0)
    logp = old + t(-0.9, 0.0)
    loss, _ = gmpo_loss(logp, old, t(1.0, 3.0), torch.ones(2), torch.tensor([0, 0]))
    torch.testing.assert_close(loss, torch.full((2,), -2.0 * math.exp(-0.45)))


def test_dro_value_and_gradient():
    # L = -(A logp - beta/2 (logp - old)^2) = -(2 * -1 - 0.25 * 0.25) = 2.0625; dL/dlogp = -(A - beta (logp -
    # old)) = -1.75. The masked token adds nothing.
    logp = t(-1.0, 5.0).requires_grad_(True)
    loss, _ = dro_loss(logp, t(-1.5, 0.0), t(2.0, 9.0), t(1.0, 0.0), torch.tensor([0, 0]), dro_beta=0.5)
    torch.testing.assert_close(loss.detach(), t(2.0625, 0.0))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, t(-1.75, 0.0))


# Covariance (A - mean A)(logp - mean logp) with mean A = 0, mean logp = -1.1:
# token 0: 2 * 1.0 = 2.0 (in Clip-Cov's band (1, 5)); token 3: -2 * -0.2 = 0.4 (below it); others 0.
COV_LOGP = t(-0.1, -1.0, -1.0, -1.3, -1.1)
COV_ADV = t(2.0, 0.0, 0.0, -2.0, 0.0)


def test_clip_cov_cuts_the_high_covariance_token():
    logp = COV_LOGP.clone().requires_grad_(True)
    mask = t(1.0, 1.0, 1.0, 1.0, 1.0)
    loss, metrics = clip_cov_loss(logp, COV_LOGP, COV_ADV, mask, torch.zeros(5, dtype=torch.long))
    torch.testing.assert_close(loss.detach(), t(0.0, 0.0, 0.0, 2.0, 0.0))  # token 0 cut, token 3: -A r
    torch.testing.assert_close(metrics["cov_clipfrac"], t(1.0, 0.0, 0.0, 0.0, 0.0))
    loss.sum().backward()
    assert logp.grad is not None and logp.grad[0] == 0 and logp.grad[3] == 2.0


def test_clip_cov_picks_at_most_its_share_at_random():
    torch.manual_seed(0)
    n = 200
    adv = torch.randn(n)
    logp = -torch.rand(n) * 3
    cov = (adv - adv.mean()) * (logp - logp.mean())
    loss, metrics = clip_cov_loss(
        logp, logp, adv, torch.ones(n), torch.zeros(n, dtype=torch.long), clip_cov_ratio=0.02, clip_cov_lb=0.0
    )
    cut = metrics["cov_clipfrac"].bool()
    assert int(cut.sum()) == 4 and bool((cov[cut] > 0).all()) and bool((loss[cut] == 0).all())


def test_kl_cov_penalises_the_top_covariance_tokens_only():
    # 5 tokens, ratio 0.2 -> 1 token: token 0 (cov 2.0) gets + coef |logp - old| = 0.5 * 0.2; all unclipped.
    old = COV_LOGP - t(0.2, 0.0, 0.0, 0.3, 0.0)
    loss, metrics = kl_cov_loss(
        COV_LOGP,
        old,
        COV_ADV,
        torch.ones(5),
        torch.zeros(5, dtype=torch.long),
        kl_cov_ratio=0.2,
        kl_cov_coef=0.5,
    )
    want = -COV_ADV * torch.exp(COV_LOGP - old) + t(0.1, 0.0, 0.0, 0.0, 0.0)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(metrics["clipfrac"], t(1.0, 0.0, 0.0, 0.0, 0.0))
    loss2, _ = kl_cov_loss(
        COV_LOGP, old, COV_ADV, torch.ones(5), torch.zeros(5, dtype=torch.long), kl_cov_ratio=0.4
    )
    assert loss2[3] == want[3] + 0.3  # ratio 0.4 -> 2 tokens: token 3 (cov 0.4, the next highest) too
