"""On-policy distillation (`distill`): the per-token reverse-KL advantage on hand-computed values, its mix with
the GRPO outcome advantage, and the `reverse_kl` metric."""

import pytest
import torch

from ascent.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, distill, grpo, ppo_loss, reverse_kl


def inputs(rewards=(1.0, 0.0), teacher=None, sampler=None):
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])  # row 1: an observation token at t=1
    return AdvantageInputs(
        rewards=torch.tensor(rewards),
        mask=mask,
        group_ids=torch.tensor([0, 0]),
        teacher_logprobs=torch.tensor([[-1.0, -0.5, -9.0], [-2.0, -9.0, -0.25]])
        if teacher is None
        else teacher,
        sampler_logprobs=torch.tensor([[-0.5, -1.5, 0.0], [-1.0, 0.0, -0.25]])
        if sampler is None
        else sampler,
    )


def test_each_token_gets_coef_times_teacher_minus_sampler_and_masked_tokens_zero():
    out = distill(inputs(), distill_coef=2.0)
    # row 0: 2 * (-1 + 0.5), 2 * (-0.5 + 1.5), masked; row 1: 2 * (-2 + 1), masked, 2 * (-0.25 + 0.25)
    expected = torch.tensor([[-1.0, 2.0, 0.0], [-2.0, 0.0, 0.0]])
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected)


def test_pure_distillation_ignores_the_rewards():
    a = distill(inputs(rewards=(1.0, 0.0))).advantages
    b = distill(inputs(rewards=(5.0, -3.0))).advantages
    assert torch.equal(a, b)


def test_reward_weight_adds_the_grpo_advantage_on_every_policy_token():
    inp = inputs()
    out = distill(inp, distill_coef=1.0, reward_weight=0.5)
    pure = distill(inp).advantages
    torch.testing.assert_close(out.advantages, pure + 0.5 * grpo(inp).advantages)
    # by hand: rewards (1, 0), mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / sqrt(0.5) = +-0.7071
    torch.testing.assert_close(
        out.advantages[0, 0], torch.tensor(-0.5 + 0.5 * 0.5 / 0.5**0.5), atol=1e-4, rtol=0
    )
    assert out.advantages[1, 1] == 0.0  # the observation token stays out


def test_without_teacher_logprobs_it_says_what_is_missing():
    inp = AdvantageInputs(rewards=torch.zeros(2), mask=torch.ones(2, 3), group_ids=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="teacher_logprobs"):
        distill(inp)


def test_registered_under_its_name():
    assert ADVANTAGE_ESTIMATORS["distill"] is distill


def test_reverse_kl_is_the_mean_of_sampler_minus_teacher_over_sampled_tokens():
    inp = inputs()
    assert inp.sampler_logprobs is not None and inp.teacher_logprobs is not None
    kl = reverse_kl(inp.sampler_logprobs, inp.teacher_logprobs, inp.mask)
    # tokens: 0.5, -1.0, 1.0, 0.0 -> 0.125
    torch.testing.assert_close(kl, torch.tensor(0.125))
    assert reverse_kl(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2)) == 0.0
    garbage = torch.tensor([[-1.0, float("nan")]])  # behind the mask: must not leak
    assert reverse_kl(torch.zeros(1, 2), garbage, torch.tensor([[1.0, 0.0]])) == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_signal_with_ppo_pulls_a_student_toward_the_teacher(seed):
    """A one-token bandit: a categorical student samples 64 tokens a step, `distill` scores them against a
    fixed teacher, `ppo_loss` (token mean) updates the student's logits. The exact reverse KL(student ||
    teacher) must fall to under a third of its start in 40 steps (measured, seeds 0-5: from 0.55-2.27 to under
    0.035)."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.log_softmax(2.0 * torch.randn(8, generator=gen), -1)
    logits = torch.zeros(8, requires_grad=True)
    opt = torch.optim.SGD([logits], lr=0.5)

    def exact_kl():
        logp = torch.log_softmax(logits.detach(), -1)
        return float((logp.exp() * (logp - teacher)).sum())

    start = exact_kl()
    n = 64
    for _ in range(40):
        tokens = torch.multinomial(torch.softmax(logits.detach(), -1), n, replacement=True, generator=gen)
        old = torch.log_softmax(logits.detach(), -1)[tokens]
        inp = AdvantageInputs(
            rewards=torch.zeros(n),
            mask=torch.ones(n, 1),
            group_ids=torch.arange(n),
            teacher_logprobs=teacher[tokens].unsqueeze(-1),
            sampler_logprobs=old.unsqueeze(-1),
        )
        adv = distill(inp).advantages.squeeze(-1)
        logp = torch.log_softmax(logits, -1)[tokens]
        loss, _ = ppo_loss(logp, old, adv, torch.ones(n), torch.arange(n))
        opt.zero_grad()
        loss.mean().backward()
        opt.step()
    assert exact_kl() < start / 3, (start, exact_kl())
