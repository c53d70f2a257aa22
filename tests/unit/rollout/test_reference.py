"""Tests for the reference rollout engine: batching invariance, seeding, logprobs against a teacher-forced
forward pass, stop conditions, weight updates and the engine registry."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

from ascent.messages import Generation, GenerationRequest, SamplingParams
from ascent.rollout import ENGINES, ReferenceEngine, RolloutEngine, build_engine

PROMPTS = [[2, 5, 6, 7, 8, 9, 10], [3, 4], [2, 11, 12, 13, 14], [40, 41, 42, 43]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
MakeEngine = Callable[..., ReferenceEngine]


def _requests(params: SamplingParams, prompts: list[list[int]] = PROMPTS) -> list[GenerationRequest]:
    return [GenerationRequest(list(p), params, request_id=i) for i, p in enumerate(prompts)]


def _one(engine: ReferenceEngine, prompt: list[int], params: SamplingParams) -> Generation:
    return engine.generate([GenerationRequest(prompt, params)])[0][0]


def test_engine_satisfies_protocol(make_engine: MakeEngine) -> None:
    assert isinstance(make_engine(), RolloutEngine)


def test_greedy_batched_with_padding_equals_one_at_a_time(make_engine: MakeEngine) -> None:
    engine = make_engine(generation_batch_size=8)
    batched = engine.generate(_requests(GREEDY))
    singles = [_one(engine, p, GREEDY) for p in PROMPTS]
    for out, single in zip(batched, singles, strict=True):
        assert out[0].token_ids == single.token_ids
        torch.testing.assert_close(out[0].logprobs, single.logprobs, atol=1e-5, rtol=0)
    assert len({tuple(o[0].token_ids) for o in batched}) == len(PROMPTS)  # outputs really differ per prompt


def test_chunked_batches_match_one_big_batch(make_engine: MakeEngine) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=8, n=3, seed=11)
    big = make_engine(generation_batch_size=64).generate(_requests(params))
    small = make_engine(generation_batch_size=5).generate(_requests(params))
    assert [[g.token_ids for g in r] for r in big] == [[g.token_ids for g in r] for r in small]


def test_seeded_sampling_is_reproducible_and_samples_differ(make_engine: MakeEngine) -> None:
    engine = make_engine()
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=10, n=4, seed=1234)
    first, second = engine.generate(_requests(params)), engine.generate(_requests(params))
    assert [len(r) for r in first] == [4] * len(PROMPTS)
    assert [[g.token_ids for g in r] for r in first] == [[g.token_ids for g in r] for r in second]
    assert len({tuple(g.token_ids) for g in first[0]}) > 1  # the n samples are not copies
    alone = engine.generate([GenerationRequest(PROMPTS[2], params)])[0]
    assert [g.token_ids for g in alone] == [g.token_ids for g in first[2]]  # batch-independent
    other = engine.generate(_requests(SamplingParams(temperature=1.0, max_new_tokens=10, n=4, seed=99)))
    assert [g.token_ids for g in other[0]] != [g.token_ids for g in first[0]]


def _teacher_forced_logprobs(engine: ReferenceEngine, prompt: list[int], gen: Generation, temp: float):
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    logprobs = (logits / temp).log_softmax(-1)
    return logprobs.gather(1, torch.tensor(gen.token_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=5, top_p=0.9, max_new_tokens=10, n=2, seed=5),
        SamplingParams(temperature=1.3, min_p=0.05, max_new_tokens=10, n=2, seed=6),
        SamplingParams(temperature=0.0, max_new_tokens=10),
    ],
)
def test_logprobs_match_teacher_forced_forward(make_engine: MakeEngine, params: SamplingParams) -> None:
    engine = make_engine()
    outputs = engine.generate(_requests(params))
    temp = params.temperature or 1.0
    for prompt, gens in zip(PROMPTS, outputs, strict=True):
        for gen in gens:
            expected = _teacher_forced_logprobs(engine, prompt, gen, temp)
            torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-5, rtol=0)


def test_max_new_tokens_gives_length(make_engine: MakeEngine) -> None:
    engine = make_engine()
    gen = _one(engine, PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=5))
    assert 1 not in gen.token_ids  # this prompt's greedy output has no EOS in its first tokens
    assert len(gen.token_ids) == len(gen.logprobs) == 5
    assert gen.finish_reason == "length"


def _first_new_index(tokens: list[int]) -> int:
    """An index >= 2 whose token did not occur earlier (so stopping on it stops exactly there)."""
    return next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])


def test_stop_token_ids_and_eos_stop_and_keep_the_stop_token(make_engine: MakeEngine) -> None:
    engine = make_engine()
    full = _one(engine, PROMPTS[1], GREEDY).token_ids
    k = _first_new_index(full)
    gen = _one(
        engine, PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(full[k],))
    )
    assert gen.token_ids == full[: k + 1]
    assert gen.finish_reason == "stop"
    eos_engine = ReferenceEngine(engine.model, eos_token_ids=[full[k]], pad_token_id=0)
    assert _one(eos_engine, PROMPTS[1], GREEDY).token_ids == full[: k + 1]


def test_stop_strings_stop_at_the_token_that_completes_them(make_engine: MakeEngine, tiny_path) -> None:
    from ascent.models import load_tokenizer

    tok = load_tokenizer(tiny_path)
    engine = make_engine()
    full = _one(engine, PROMPTS[0], GREEDY).token_ids
    k = _first_new_index(full)
    stop = tok.decode(full[k - 1 : k + 1])  # two characters ending at token k
    expected = next(i for i in range(1, len(full) + 1) if stop in tok.decode(full[:i]))
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_strings=(stop,))
    gen = _one(engine, PROMPTS[0], params)
    assert gen.token_ids == full[:expected]
    assert gen.finish_reason == "stop"
    assert stop in tok.decode(gen.token_ids) and stop not in tok.decode(gen.token_ids[:-1])


def test_stop_strings_without_decode_is_a_clear_error(make_engine: MakeEngine) -> None:
    engine = ReferenceEngine(make_engine().model, eos_token_ids=[1], pad_token_id=0)
    with pytest.raises(ValueError, match="decode"):
        _one(engine, PROMPTS[0], SamplingParams(stop_strings=("x",)))


def test_repetition_penalty_runs_and_changes_greedy_output(make_engine: MakeEngine) -> None:
    engine = make_engine()
    plain = _one(engine, PROMPTS[0], GREEDY)
    penalised = _one(
        engine, PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=12, repetition_penalty=5.0)
    )
    assert penalised.token_ids != plain.token_ids
    assert len(set(penalised.token_ids)) > len(set(plain.token_ids))  # fewer repeats


def test_update_weights_changes_outputs_and_checks_names(make_engine: MakeEngine) -> None:
    engine = make_engine()
    before = _one(engine, PROMPTS[0], GREEDY).token_ids
    weights = dict(engine.model.state_dict())
    engine.update_weights([("lm_head.weight", -weights["lm_head.weight"])])
    assert _one(engine, PROMPTS[0], GREEDY).token_ids != before
    with pytest.raises(KeyError, match="no parameter named 'module.lm_head.weight'"):
        engine.update_weights([("module.lm_head.weight", weights["lm_head.weight"])])
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights([("lm_head.weight", torch.zeros(3, 3))])


def test_shared_module_keeps_its_training_mode(make_engine: MakeEngine) -> None:
    model = make_engine().model.train()
    engine = ReferenceEngine(model, eos_token_ids=[1], pad_token_id=0)
    _one(engine, PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=2))
    assert model.training
    engine.sleep()
    engine.wake()


def test_empty_prompt_is_rejected(make_engine: MakeEngine) -> None:
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        make_engine().generate([GenerationRequest([], GREEDY, request_id=7)])


def test_registry_names_engine_and_known_names() -> None:
    assert "reference" in ENGINES
    with pytest.raises(ValueError, match=r"rollout.engine='nope'.*reference"):
        build_engine("nope", model_path="x")


def test_generation_passes_the_kv_cache_without_deprecated_names(make_engine: MakeEngine) -> None:
    """Our forward calls use the cache argument the installed transformers names (`cache` from 5.2x on,
    `past_key_values` before): no FutureWarning or DeprecationWarning about deprecated names from them."""
    engine = make_engine()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.generate(_requests(GREEDY))
    deprecated = [
        str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
    ]
    assert [m for m in deprecated if "deprecated" in m.lower()] == []


def test_action_tokens_are_the_only_tokens_sampled_and_a_full_action_turn_stops(
    make_engine: MakeEngine,
) -> None:
    """rollout.action_token_ids: every sampled token is one of them, a turn of max_new_tokens of them ends
    with "stop", and the logprobs are the unfiltered distribution's (what the trainer scores)."""
    engine = make_engine()
    actions = (20, 21, 22)
    params = SamplingParams(temperature=1.0, max_new_tokens=3, seed=5, n=4, allowed_token_ids=actions)
    free = SamplingParams(temperature=1.0, max_new_tokens=3, seed=5, n=4)
    for request, gens in zip(_requests(params), engine.generate(_requests(params)), strict=True):
        for g in gens:
            assert set(g.token_ids) <= set(actions) and len(g.token_ids) == 3 and g.finish_reason == "stop"
            ids = torch.tensor([request.prompt_ids + g.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(engine.model(input_ids=ids).logits[0].float(), -1)
            want = logp[len(request.prompt_ids) - 1 : -1].gather(-1, torch.tensor(g.token_ids)[:, None])
            torch.testing.assert_close(torch.tensor(g.logprobs), want[:, 0], atol=1e-4, rtol=0)
    unconstrained = [g for r in engine.generate(_requests(free)) for g in r]
    assert any(not set(g.token_ids) <= set(actions) for g in unconstrained)  # the filter did the narrowing
    assert any(g.finish_reason == "length" for g in unconstrained)  # a full turn of free text is cut
