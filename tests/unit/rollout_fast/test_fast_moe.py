"""The fast engine on a Qwen3-MoE: its routed-experts layer (`ascent.rollout.fast.moe`) samples what
transformers' model samples, from a checkpoint saved per expert (owned, stacked weights) and from the
trainer's module (shared, stacked), and takes the trainer's publications (stacked names).

Routing replay: the experts it records for every token (`Generation.routed_experts`) are those the reference
engine records (fp32), through a prefill with forked samples, prompts fed through decode steps, and a
session's second turn whose prefix comes from the cache. The one difference is by design: the last sampled
token, which no forward of the fast engine read, is NOT_RECORDED (the reference engine records it when its
batch ran on past it; the trainer routes that token itself, and no logprob depends on it)."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import load_model
from ascent.models.moe import NOT_RECORDED, ROUTES_DTYPE
from ascent.models.tiny import make_tiny_moe_checkpoint
from ascent.rollout import ReferenceEngine
from ascent.rollout.fast import build_fast_engine


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return make_tiny_moe_checkpoint(tmp_path_factory.mktemp("moe_fast"), expert_scale=10.0, seed=2)


def _requests():
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=12, n=2, seed=7)
    return [GenerationRequest(torch.randint(4, 80, (n,), generator=g).tolist(), params) for n in (3, 25)]


def _tokens_and_logprobs(outs):
    return [g.token_ids for gs in outs for g in gs], [g.logprobs for gs in outs for g in gs]


@pytest.mark.parametrize("share", [False, True])
def test_fast_engine_samples_what_transformers_samples(moe_path, share):
    model = load_model(moe_path, dtype="fp32", device="cpu")
    want_tokens, want_lp = _tokens_and_logprobs(ReferenceEngine(model, [1], 0).generate(_requests()))
    source = {"model": model} if share else {"model_path": moe_path}
    fast = build_fast_engine(**source, dtype="fp32", device="cpu", page_size=16, max_model_len=64)
    assert fast.weights.shared is share
    assert fast.weights.layers[0].down_w.shape == (8, 64, 32)  # stacked experts [E, H, I]
    tokens, lps = _tokens_and_logprobs(fast.generate(_requests()))
    assert tokens == want_tokens
    for a, b in zip(lps, want_lp, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


def test_publication_of_the_trainers_stacked_experts(moe_path):
    fast = build_fast_engine(model_path=moe_path, dtype="fp32", device="cpu", page_size=16, max_model_len=64)
    trainer = load_model(moe_path, dtype="fp32", device="cpu")
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if ".mlp." in name:
                p.mul_(1.5)  # a changed router and changed experts
    names = dict(trainer.named_parameters())
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and "model.layers.0.mlp.gate.weight" in names
    fast.update_weights(names.items())
    want, _ = _tokens_and_logprobs(ReferenceEngine(trainer, [1], 0).generate(_requests()))
    got, _ = _tokens_and_logprobs(fast.generate(_requests()))
    assert got == want


# ---------------------------------------------------------------------------------------- routing replay
def _assert_same_routes(fast_outs, ref_outs, layers=2, k=2):
    """Every generation: routes [prompt + response, layers, k] int16, the reference's but the last token,
    which the fast engine leaves NOT_RECORDED."""
    for fast_gens, ref_gens in zip(fast_outs, ref_outs, strict=True):
        for got, want in zip(fast_gens, ref_gens, strict=True):
            assert got.token_ids == want.token_ids
            routes = got.routed_experts
            assert routes.dtype == ROUTES_DTYPE and routes.shape == want.routed_experts.shape
            assert routes.shape[1:] == (layers, k)
            assert torch.equal(routes[:-1], want.routed_experts[:-1])
            assert (routes[-1] == NOT_RECORDED).all() and (routes[:-1] >= 0).all()


def test_routes_of_a_prefill_with_forked_samples(moe_path):
    ref = ReferenceEngine(load_model(moe_path, dtype="fp32", device="cpu"), [1], 0)
    fast = build_fast_engine(model_path=moe_path, dtype="fp32", device="cpu", page_size=16, max_model_len=64)
    got = fast.generate(_requests())
    _assert_same_routes(got, ref.generate(_requests()))
    for a, b in got:  # two samples of one prompt: the prompt's routes shared, their own after
        p = len(a.routed_experts) - len(a.token_ids)
        assert torch.equal(a.routed_experts[:p], b.routed_experts[:p]) and a.token_ids != b.token_ids


def test_routes_of_fed_prompts_and_a_session_turn(moe_path):
    """Two rows: the later single-sample prompts join running rows through decode steps (fed); then a
    session's second turn reuses the first turn's cache and the routes kept with it."""
    ref = ReferenceEngine(load_model(moe_path, dtype="fp32", device="cpu"), [1], 0)
    fast = build_fast_engine(
        model_path=moe_path, dtype="fp32", device="cpu", page_size=16, max_model_len=96, max_batch_size=2
    )
    reqs = [
        GenerationRequest(list(range(4, 4 + n)), SamplingParams(temperature=0.0, max_new_tokens=m))
        for n, m in ((20, 4), (7, 12), (5, 6), (9, 8))
    ]
    _assert_same_routes(fast.generate(reqs), ref.generate(reqs))
    assert fast.stats["fed_tokens"] > 0

    first = GenerationRequest(
        list(range(4, 30)), SamplingParams(temperature=0.0, max_new_tokens=10), session_id="s"
    )
    (out,) = fast.generate([first])[0]
    params = SamplingParams(max_new_tokens=10, n=2, seed=3)
    turn2 = GenerationRequest(first.prompt_ids + out.token_ids + [7, 8, 9], params, session_id="s")
    got = fast.generate([turn2])
    assert got[0][0].cached_tokens > len(first.prompt_ids)
    _assert_same_routes(got, ref.generate([turn2]))
