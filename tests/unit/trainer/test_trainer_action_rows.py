"""An action-head policy in the loop's pieces: the reference engine answers a request with one placeholder
token and an action chunk (seeded draws repeat), the packer finds the placeholders, the trainer's token
logprobs score them with the head from the same hidden state (agreeing with the sampler, gradients reaching
the head), the engine takes the head's weights by name, and the head round-trips through a checkpoint."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ascent.messages import GenerationRequest, SamplingParams, TrainSample
from ascent.models.action_head import (
    HEAD_FILE,
    ActionHeadSpec,
    action_head_of,
    attach_action_head,
    save_action_head,
    without_action_head,
)
from ascent.rollout.reference import ReferenceEngine
from ascent.trainer.logprobs import token_logprobs
from ascent.trainer.packing import pack

SPEC = ActionHeadSpec(dim=2, chunk=3, init_std=0.7, token_id=4)


def tiny() -> Qwen2ForCausalLM:
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


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    m = tiny()
    head = attach_action_head(m, SPEC)
    with torch.no_grad():
        head.mean_proj.weight.normal_(0, 0.3)  # a mean that depends on the state
    return m


def act(engine: ReferenceEngine, prompts: list[list[int]], seed: int | None = None):
    params = SamplingParams(seed=seed, max_new_tokens=1)
    return [g for (g,) in engine.generate([GenerationRequest(p, params) for p in prompts])]


def test_the_engine_answers_with_a_placeholder_and_a_chunk_and_seeds_repeat(model) -> None:
    engine = ReferenceEngine(model, [1], 0, action_head=SPEC)
    first, second = act(engine, [[5, 6, 7], [8, 9]], seed=3)
    assert first.token_ids == [4] and first.finish_reason == "stop" and len(first.logprobs) == 1
    assert first.action is not None and torch.tensor(first.action).shape == (3, 2)
    assert act(engine, [[5, 6, 7], [8, 9]], seed=3)[0] == first
    assert act(engine, [[5, 6, 7], [8, 9]], seed=4)[0].action != first.action


def test_the_trainer_scores_the_placeholders_with_the_head_as_the_sampler_did(model) -> None:
    engine = ReferenceEngine(model, [1], 0, action_head=SPEC)
    prompt = [5, 6, 7]
    a1 = act(engine, [prompt], seed=1)[0]
    observation = [10, 11]
    a2 = act(engine, [prompt + [4] + observation], seed=2)[0]
    sample = TrainSample(
        prompt_ids=prompt,
        response_ids=[4, *observation, 4],
        loss_mask=[1, 0, 0, 1],
        advantages=[1.0, 0.0, 0.0, 1.0],
        actions=[a1.action, a2.action],
    )
    other = TrainSample(prompt_ids=[2, 3], response_ids=[9, 8], loss_mask=[1, 1], advantages=[0.0, 0.0])
    packed = pack([other, sample])
    assert packed.action_rows is not None and packed.action_rows.tolist() == [2, 5]
    logp, ent = token_logprobs(model, packed, with_entropy=True)
    assert logp[[2, 5]].tolist() == pytest.approx(a1.logprobs + a2.logprobs, abs=1e-5)
    assert ent is not None and ent[2].item() == pytest.approx(ent[5].item())
    head = action_head_of(model)
    assert head is not None
    head.zero_grad()
    logp[[2, 5]].sum().backward()
    assert head.mean_proj.weight.grad is not None and head.mean_proj.weight.grad.abs().sum() > 0
    assert head.log_std.grad is not None and head.log_std.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="1 actions for 2 sampled tokens"):
        pack([TrainSample([2], [4, 4], [1, 1], [0.0, 0.0], actions=[a1.action])])


def test_the_engine_takes_the_heads_weights_by_name_and_a_checkpoint_keeps_them(model, tmp_path) -> None:
    copy = tiny()
    attach_action_head(copy, SPEC)
    engine = ReferenceEngine(copy, [1], 0, action_head=SPEC)
    engine.update_weights((n, p.detach()) for n, p in model.named_parameters())
    assert act(engine, [[5, 6]], seed=0) == act(ReferenceEngine(model, [1], 0, action_head=SPEC), [[5, 6]], 0)
    save_action_head(model, tmp_path)
    assert (tmp_path / HEAD_FILE).is_file()
    fresh = tiny()
    loaded = attach_action_head(fresh, SPEC, tmp_path)
    assert torch.equal(loaded.mean_proj.weight, action_head_of(model).mean_proj.weight)  # type: ignore[union-attr]
    with without_action_head(fresh):
        assert action_head_of(fresh) is None and not any("action_head" in k for k in fresh.state_dict())
    assert action_head_of(fresh) is loaded
