"""The continuous action head (ascent.models.action_head) with its sampler (ascent.rollout.action_sampler)
and its trainer side (ascent.trainer.action_policy): the Gaussian log-probability by hand, the sampler and
the trainer agreeing on it, and a PPO step moving the mean toward a rewarded action."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ascent.models.action_head import ActionHead, gaussian_entropy, gaussian_logprob, last_hidden_states
from ascent.rollout.action_sampler import ActionSampler
from ascent.trainer.action_policy import action_logprobs, action_policy_loss

OBSERVATIONS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]  # token ids


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return Qwen2ForCausalLM(config).eval()


def test_the_log_probability_is_the_diagonal_gaussians_by_hand():
    # one chunk of 2 steps x 2 dimensions; sigma = (1, 2)
    actions = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    mean = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])
    log_std = torch.tensor([0.0, math.log(2.0)])
    c = 0.5 * math.log(2 * math.pi)
    by_hand = (-0.5 - c) + (0 - math.log(2) - c) + (0 - c) + (-0.5 - math.log(2) - c)
    assert gaussian_logprob(actions, mean, log_std).item() == pytest.approx(by_hand, abs=1e-6)
    entropy = 2 * (
        (0 + 0.5 * (1 + math.log(2 * math.pi))) + (math.log(2) + 0.5 * (1 + math.log(2 * math.pi)))
    )
    assert gaussian_entropy(log_std, chunk=2).item() == pytest.approx(entropy, abs=1e-6)


def test_the_hidden_state_of_a_padded_batch_is_each_sequences_own(model):
    batched = last_hidden_states(model, OBSERVATIONS)
    for i, seq in enumerate(OBSERVATIONS):
        torch.testing.assert_close(batched[i], last_hidden_states(model, [seq])[0], atol=1e-5, rtol=0)


def test_the_sampler_and_the_trainer_agree_on_each_actions_log_probability(model):
    torch.manual_seed(0)
    head = ActionHead(32, action_dim=3, chunk=2, init_log_std=-0.5)
    torch.nn.init.normal_(head.mean_proj.weight, std=0.3)  # a mean that depends on the observation
    samples = ActionSampler(model, head, seed=7).act(OBSERVATIONS)
    again = ActionSampler(model, head, seed=7).act(OBSERVATIONS)
    assert samples == again and len({str(s.actions) for s in samples}) == 3  # seeded, and they differ
    actions = torch.tensor([s.actions for s in samples])
    assert actions.shape == (3, 2, 3)
    trained = action_logprobs(model, head, OBSERVATIONS, actions)
    assert trained.requires_grad
    torch.testing.assert_close(
        trained.detach(), torch.tensor([s.logprob for s in samples]), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_steps_move_the_mean_toward_the_rewarded_action(model, seed):
    """Two actions sampled per observation; the one nearer +1 is rewarded (advantage +1, the other -1):
    a few PPO steps on the head move every observation's mean toward +1."""
    torch.manual_seed(seed)
    head = ActionHead(32, action_dim=1, chunk=1)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    sampler = ActionSampler(model, head, seed=seed)
    start = head.mean(last_hidden_states(model, OBSERVATIONS)).detach()
    for _ in range(15):
        pairs = [sampler.act(OBSERVATIONS) for _ in range(2)]
        seqs = OBSERVATIONS * 2
        actions = torch.tensor([s.actions for p in pairs for s in p])
        old = torch.tensor([s.logprob for p in pairs for s in p])
        nearer = (actions[:3, 0, 0] - 1).abs() < (actions[3:, 0, 0] - 1).abs()
        adv = torch.cat([nearer.float() * 2 - 1, 1 - nearer.float() * 2])
        loss, metrics = action_policy_loss(model, head, seqs, actions, old, adv)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    end = head.mean(last_hidden_states(model, OBSERVATIONS)).detach()
    assert ((end - 1).abs() < (start - 1).abs() - 0.2).all(), (start.flatten(), end.flatten())
