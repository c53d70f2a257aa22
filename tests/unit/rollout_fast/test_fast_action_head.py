"""A continuous action head (`model.action_head`) on the fast engine (ascent/rollout/fast/action.py): every
request is one action turn whose placeholder token, chunk log-probability and chunk are the reference
engine's for the same seed; a session's next turn reuses the cache; published `action_head.*` tensors reach
the head; an unseeded action's logprob is the head's log-probability of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models.action_head import HEAD_FILE, ActionHead, ActionHeadSpec, last_hidden_states
from ascent.rollout import build_engine
from ascent.rollout.fast import build_fast_engine

SPEC = ActionHeadSpec(dim=2, chunk=3, init_std=0.7, token_id=7)


def _head_state(seed: int, hidden: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "mean_proj.weight": torch.randn(SPEC.chunk * SPEC.dim, hidden, generator=g) * 0.5,
        "mean_proj.bias": torch.randn(SPEC.chunk * SPEC.dim, generator=g),
        "log_std": torch.randn(SPEC.dim, generator=g) * 0.3,
    }


def _engines(fast_tiny_path: Path, tmp_path: Path):
    """A checkpoint with a trained-looking head file -> (reference engine, fast engine), both acting."""
    path = tmp_path / "ckpt"
    shutil.copytree(fast_tiny_path, path)
    ref = build_engine("reference", model_path=path, device="cpu", action_head=SPEC)
    save_file(_head_state(0, ref.model.config.hidden_size), str(path / HEAD_FILE))
    ref = build_engine("reference", model_path=path, device="cpu", action_head=SPEC)
    fast = build_fast_engine(
        model_path=path, dtype="fp32", device="cpu", page_size=16, max_model_len=160, action_head=SPEC
    )
    return ref, fast


def _requests(prompts: list[list[int]], seeds: list[int | None], session: str | None = None):
    return [
        GenerationRequest(p, SamplingParams(max_new_tokens=4, seed=s), request_id=i, session_id=session)
        for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
    ]


def _assert_same(fast_out, ref_out) -> None:
    for [f], [r] in zip(fast_out, ref_out, strict=True):
        assert f.token_ids == r.token_ids == [SPEC.token_id] and f.finish_reason == r.finish_reason == "stop"
        torch.testing.assert_close(torch.tensor(f.action), torch.tensor(r.action), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(r.logprobs), atol=1e-5, rtol=0)


def test_the_fast_engine_acts_as_the_reference_engine_and_sessions_reuse_the_cache(fast_tiny_path, tmp_path):
    ref, fast = _engines(fast_tiny_path, tmp_path)
    prompts = [[5, 9, 11, 30], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [42]]
    first = _requests(prompts, [1, 2, 3], session="s")
    out = fast.generate(first)
    _assert_same(out, ref.generate(first))
    assert len({tuple(g[0].action[0]) for g in out}) == 3  # the loaded head acts on each state
    # the next turn: the observation so far (the placeholder included) and new tokens; sessions reuse K/V
    later = [p + [SPEC.token_id, 21, 22] for p in prompts[:1]]
    reqs = _requests(later, [4], session="s")
    again = fast.generate(reqs)
    _assert_same(again, ref.generate(reqs))
    assert again[0][0].cached_tokens > 0


def test_an_unseeded_action_has_the_heads_log_probability(fast_tiny_path, tmp_path):
    ref, fast = _engines(fast_tiny_path, tmp_path)
    prompt = [5, 9, 11, 30, 2]
    [[a]], [[b]] = fast.generate(_requests([prompt], [None])), fast.generate(_requests([prompt], [None]))
    assert a.action != b.action  # fresh noise each time
    hidden = last_hidden_states(ref.model, [prompt, prompt])
    head: ActionHead = ref.model.action_head
    scored = head.log_prob(hidden, torch.tensor([a.action, b.action]))
    torch.testing.assert_close(scored, torch.tensor(a.logprobs + b.logprobs), atol=1e-5, rtol=0)


def test_a_published_head_is_used_after_an_update(fast_tiny_path, tmp_path):
    ref, fast = _engines(fast_tiny_path, tmp_path)
    reqs = _requests([[5, 9, 11, 30]], [1])
    before = fast.generate(reqs)
    new = [(f"action_head.{k}", v) for k, v in _head_state(1, ref.model.config.hidden_size).items()]
    lm_head = ref.model.get_output_embeddings().weight.detach() * 2  # decoder tensors in the same publication
    publication = [*new, ("lm_head.weight", lm_head)]
    fast.update_weights(publication)
    ref.update_weights(publication)
    after = fast.generate(reqs)
    _assert_same(after, ref.generate(reqs))
    assert after[0][0].action != before[0][0].action


def test_an_engine_on_a_given_module_shares_its_head(fast_tiny_path, tmp_path):
    """A colocated engine built on the trainer's module acts with the module's own head (its tensors are not
    the decoder's), so the head's in-place steps reach it without a publication."""
    ref, _ = _engines(fast_tiny_path, tmp_path)
    fast = build_fast_engine(
        model=ref.model, dtype="fp32", device="cpu", page_size=16, max_model_len=160, action_head=SPEC
    )
    assert fast.runner.action is not None and fast.runner.action.head is ref.model.action_head
    reqs = _requests([[5, 9, 11, 30]], [1])
    _assert_same(fast.generate(reqs), ref.generate(reqs))


def test_a_head_over_tensor_parallel_ranks_is_refused(fast_tiny_path):
    with pytest.raises(ValueError, match="rollout.tensor_parallel=1"):
        build_fast_engine(model_path=fast_tiny_path, device="cpu", tensor_parallel=2, action_head=SPEC)
