"""The fast engine on CPU against the reference engine: same tokens, same logprobs, same finish reasons."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout import ReferenceEngine
from ascent.rollout.fast import build_fast_engine


def _requests(seed=0, lens=(5, 17, 26, 16, 3), n=(1, 3, 2, 1, 4), max_new=(12, 9, 16, 3, 10), **params):
    g = torch.Generator().manual_seed(seed)
    params.setdefault("temperature", 0.0)
    return [
        GenerationRequest(
            torch.randint(4, 60, (length,), generator=g).tolist(),
            SamplingParams(max_new_tokens=m, n=k, seed=100 + i, **params),
            request_id=i,
        )
        for i, (length, k, m) in enumerate(zip(lens, n, max_new, strict=True))
    ]


def _tokens(out):
    return [[(g.token_ids, g.finish_reason) for g in req] for req in out]


@pytest.mark.parametrize("feed", [0, 256])
def test_greedy_equals_reference_with_continuous_batching(engines, feed):
    """Requests join as rows free up: through prefill passes, or (feed > 0) the single-sample ones have their
    prompt computed by the decode steps; the tokens are the reference engine's either way."""
    ref, fast = engines(max_batch_size=4, feed_prompt_tokens=feed)
    reqs = _requests(n=(1, 2, 1, 2, 1))
    assert _tokens(fast.generate(reqs)) == _tokens(ref.generate(reqs))
    if feed:  # requests 0-2 fill the rows; 3 (n=2) is prefilled when rows free up, 4 (n=1) is fed
        assert fast.stats["fed_tokens"] == 3 and fast.stats["prefills"] == 2
    else:
        assert fast.stats["fed_tokens"] == 0 and fast.stats["prefills"] > 2
    assert fast.stats["compactions"] > 0
    assert fast.alloc.reserved == 0 and fast.alloc.available == fast.cache.num_pages - 1


def test_fed_prompts_sample_like_prefilled_ones(engines):
    """Seeded sampling and logprobs of requests fed into a running batch equal the reference engine's and the
    teacher-forced forward's; a prompt longer than feed_prompt_tokens is prefilled instead."""
    ref, fast = engines(max_batch_size=2, feed_prompt_tokens=20)
    reqs = _requests(seed=5, n=(1, 1, 1, 1, 1), max_new=(14, 9, 16, 5, 10), temperature=0.9)
    out = fast.generate(reqs)
    assert _tokens(out) == _tokens(ref.generate(reqs))
    assert fast.stats["fed_tokens"] == 16 + 3 and fast.stats["prefill_tokens"] == 5 + 17 + 26
    for req, (g,) in zip(reqs, out, strict=True):
        ids = torch.tensor([req.prompt_ids + g.token_ids])
        with torch.no_grad():
            logits = ref.model(input_ids=ids).logits[0, len(req.prompt_ids) - 1 : -1] / 0.9
        want = logits.log_softmax(-1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)


def test_logprobs_match_teacher_forced_forward(engines):
    ref, fast = engines(max_batch_size=8)
    reqs = _requests(seed=1, temperature=0.8)
    for req, gens in zip(reqs, fast.generate(reqs), strict=True):
        for g in gens:
            ids = torch.tensor([req.prompt_ids + g.token_ids])
            with torch.no_grad():
                logits = ref.model(input_ids=ids).logits[0, len(req.prompt_ids) - 1 : -1] / 0.8
            want = logits.log_softmax(-1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.0),
        dict(temperature=0.7, top_p=0.8),
        dict(temperature=1.2, top_k=5, min_p=0.05),
        dict(temperature=1.0, repetition_penalty=1.3),
    ],
)
def test_seeded_sampling_equals_reference(engines, params):
    ref, fast = engines(max_batch_size=4)
    reqs = _requests(seed=2, **params)
    assert _tokens(fast.generate(reqs)) == _tokens(ref.generate(reqs))


def test_stop_tokens_and_stop_strings_like_reference(engines, fast_tiny_path):
    from ascent.models import load_tokenizer

    decode = load_tokenizer(fast_tiny_path).decode
    ref, fast = engines(max_batch_size=4, decode=decode)
    ref.decode = decode
    free = _tokens(fast.generate(_requests(seed=3, max_new=(30,) * 5)))
    stop_id = free[1][0][0][4]  # a token the model emits: sequences stop at it
    text = decode(free[2][0][0][3:6])
    reqs = _requests(seed=3, max_new=(30,) * 5, stop_token_ids=(stop_id,), stop_strings=(text,))
    got = _tokens(fast.generate(reqs))
    assert got == _tokens(ref.generate(reqs))
    assert got[1][0][1] == "stop" and got[2][0][1] == "stop"


def test_session_continuation_reuses_cache(engines):
    ref, fast = engines(max_batch_size=4)
    first = GenerationRequest(
        list(range(4, 40)), SamplingParams(temperature=0.0, max_new_tokens=12), session_id="a"
    )
    out = fast.generate([first])[0][0]
    assert len(fast.sessions) == 1
    before = fast.stats["prefill_tokens"]
    turn2 = first.prompt_ids + out.token_ids + [7, 8, 9]
    second = GenerationRequest(turn2, SamplingParams(temperature=0.0, max_new_tokens=12, n=2), session_id="a")
    assert _tokens(fast.generate([second])) == _tokens(ref.generate([second]))
    assert fast.stats["prefill_tokens"] - before <= 4  # only the new tokens (and the last cached one)
    third = GenerationRequest(
        [5, 6] + turn2, SamplingParams(temperature=0.0, max_new_tokens=5), session_id="a"
    )
    assert _tokens(fast.generate([third])) == _tokens(ref.generate([third]))  # no common prefix: re-prefill


def test_one_token_prefill(engines):
    """A turn that adds nothing after the cached reply prefills one token (padded to two inside, so a
    compiled model makes no graph for size 1): the samples are still the reference engine's."""
    ref, fast = engines(max_batch_size=4)
    first = GenerationRequest(
        list(range(4, 30)), SamplingParams(temperature=0.0, max_new_tokens=6), session_id="a"
    )
    out = fast.generate([first])[0][0]
    again = GenerationRequest(
        first.prompt_ids + out.token_ids,
        SamplingParams(temperature=0.0, max_new_tokens=6, n=2),
        session_id="a",
    )
    before = fast.stats["prefill_tokens"]
    assert _tokens(fast.generate([again])) == _tokens(ref.generate([again]))
    assert fast.stats["prefill_tokens"] - before == 1


def test_session_turn_fed_into_a_running_batch(engines):
    """A conversation's next turn that joins a running batch is fed from its cached prefix: only the new
    tokens go through the decode steps, the reply is the reference engine's, and its K/V serves the turn
    after (cached again)."""
    ref, fast = engines(max_batch_size=2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    first = GenerationRequest(list(range(4, 40)), greedy, session_id="a")
    out = fast.generate([first])[0][0]
    turn2 = GenerationRequest(first.prompt_ids + out.token_ids + [7, 8, 9], greedy, session_id="a")
    others = [
        GenerationRequest(list(range(50, 20, -1)), SamplingParams(temperature=0.0, max_new_tokens=n))
        for n in (20, 2)
    ]
    before = dict(fast.stats)
    got = fast.generate([*others, turn2])  # turn 2 waits for a row, then joins the 20-token one
    assert _tokens(got) == _tokens(ref.generate([*others, turn2]))
    reused = got[2][0].cached_tokens
    assert reused == len(turn2.prompt_ids) - 4  # the cached turn but its last token (never K/V-written)
    assert fast.stats["fed_tokens"] - before["fed_tokens"] == 4
    assert fast.stats["reused_tokens"] - before["reused_tokens"] == reused
    turn3 = GenerationRequest(turn2.prompt_ids + got[2][0].token_ids + [5], greedy, session_id="a")
    again = fast.generate([turn3])[0][0]
    assert again.cached_tokens == len(turn3.prompt_ids) - 2
    assert _tokens([[again]]) == _tokens(ref.generate([turn3]))


def test_conversations_sharing_a_session_id_each_keep_their_cache(engines):
    """The HTTP server runs every conversation of a session (or of clients sharing one) under one session
    id: the turns of two interleaved conversations each continue their own cached K/V."""
    ref, fast = engines(max_batch_size=4)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    firsts = [
        GenerationRequest(list(range(4, 30)), params, session_id="http:s"),
        GenerationRequest(list(range(60, 30, -1)), params, session_id="http:s"),
    ]
    outs = [fast.generate([r])[0][0] for r in firsts]
    seconds = [
        GenerationRequest(r.prompt_ids + o.token_ids + [7, 8], params, session_id="http:s")
        for r, o in zip(firsts, outs, strict=True)
    ]
    before = fast.stats["reused_tokens"]
    again = [fast.generate([r])[0][0] for r in seconds]
    expected = [turn2_reuse(r, o) for r, o in zip(firsts, outs, strict=True)]
    assert [g.cached_tokens for g in again] == expected
    assert fast.stats["reused_tokens"] - before == sum(expected)
    assert _tokens([[g] for g in again]) == _tokens(ref.generate(seconds))


def test_update_weights_sleep_wake(engines):
    ref, fast = engines(max_batch_size=8)
    reqs = _requests(seed=4)
    new = {n: t * 0.5 for n, t in ref.model.state_dict().items() if "mlp" in n or "q_proj" in n}
    ref.update_weights(list(new.items()))
    fast.update_weights(list(new.items()))
    assert _tokens(fast.generate(reqs)) == _tokens(ref.generate(reqs))
    with pytest.raises(KeyError, match="no parameter named"):
        fast.update_weights([("module.model.norm.weight", torch.ones(64))])
    fast.sleep()
    assert fast.cache.k is None
    fast.wake()
    assert _tokens(fast.generate(reqs)) == _tokens(ref.generate(reqs))


def test_shared_weights_follow_the_module(fast_tiny_path):
    ref = ReferenceEngine.from_pretrained(fast_tiny_path, "fp32", "cpu")
    fast = build_fast_engine(
        model=ref.model, dtype="fp32", device="cpu", eos_token_ids=[1], max_model_len=128
    )
    assert fast.weights.shared
    head = ref.model.get_output_embeddings().weight
    with torch.no_grad():
        head.mul_(10.0)  # an in-place "optimizer step" on the trainer's module
    reqs = _requests(seed=5)
    assert _tokens(fast.generate(reqs)) == _tokens(ref.generate(reqs))


def test_stepping_shared_weights_drops_cached_sessions(fast_tiny_path):
    """K/V cached with the weights before an in-place step is never reused after it."""
    ref = ReferenceEngine.from_pretrained(fast_tiny_path, "fp32", "cpu")
    fast = build_fast_engine(
        model=ref.model, dtype="fp32", device="cpu", eos_token_ids=[1], max_model_len=128, page_size=16
    )
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    first = GenerationRequest(list(range(4, 30)), params, session_id="a")
    out = fast.generate([first])[0][0]
    turn2 = GenerationRequest(first.prompt_ids + out.token_ids + [7, 8], params, session_id="a")
    assert fast.generate([turn2])[0][0].cached_tokens == turn2_reuse(first, out)
    with torch.no_grad():
        ref.model.get_output_embeddings().weight.mul_(10.0)
        ref.model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
    again = fast.generate([turn2])[0][0]
    assert again.cached_tokens == 0 and fast.stats["reused_tokens"] == turn2_reuse(first, out)
    assert _tokens([[again]]) == _tokens(ref.generate([turn2]))


def turn2_reuse(first, out):
    return len(first.prompt_ids) + len(out.token_ids) - 1


def test_budget_edges(engines):
    ref, fast = engines(max_batch_size=4, max_model_len=40)
    long = GenerationRequest(list(range(4, 40)), SamplingParams(temperature=0.0, max_new_tokens=10))
    zero = GenerationRequest([5, 6], SamplingParams(max_new_tokens=0))
    full = GenerationRequest(list(range(4, 44)), SamplingParams(max_new_tokens=3))
    out = fast.generate([long, zero, full])
    assert len(out[0][0].token_ids) == 4 and out[0][0].finish_reason == "length"  # capped at max_model_len
    assert out[1][0].token_ids == [] and out[2][0].token_ids == []
    with pytest.raises(ValueError, match="empty"):
        fast.generate([GenerationRequest([], SamplingParams())])


def test_error_mid_generate_leaves_engine_usable(engines, monkeypatch):
    ref, fast = engines(max_batch_size=4)
    reqs = _requests(seed=6)
    calls = {"n": 0}
    real = fast.runner.decode

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(fast.runner, "decode", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        fast.generate(reqs)
    assert fast.alloc.available == fast.cache.num_pages - 1 and fast.running == 0
    assert _tokens(fast.generate(reqs)) == _tokens(ref.generate(reqs))


@pytest.mark.parametrize("params", [{}, {"temperature": 1.0, "top_p": 0.9}])
def test_requests_fed_into_a_running_call_get_the_same_samples(engines, params):
    """generate_live: two requests start the call, three more arrive between decode steps (one of them
    needing a sampling stage the call lacks waits for the next call); every request is answered as soon as it
    ends, with the samples `generate` gives it (seeded, so batch composition does not matter)."""
    ref, fast = engines(max_batch_size=4)
    reqs = _requests(**params)
    expected = _tokens(fast.generate(reqs))
    penalised = GenerationRequest([5, 6, 7], SamplingParams(max_new_tokens=4, repetition_penalty=1.3, seed=1))
    queued = [*reqs[2:], penalised]  # the call's graphs have no penalty stage: that one must stay queued
    polls, answers = [0], {}

    def more(fits):
        polls[0] += 1
        if polls[0] < 3:
            return []
        take = [r for r in queued if fits(r)]
        for r in take:
            queued.remove(r)
        return take

    def done(i, samples):
        answers[i] = (polls[0], _tokens([samples])[0])

    fast.generate_live(reqs[:2], more, done)
    assert [answers[i][1] for i in range(5)] == expected
    assert queued == [penalised] and len(answers) == 5
    assert min(p for p, _ in answers.values()) < polls[0]  # early requests were answered before the end
    assert fast.alloc.reserved == 0 and fast.alloc.available == fast.cache.num_pages - 1


def test_a_spent_wall_clock_budget_ends_a_sample_as_abort_in_both_engines(engines):
    """SamplingParams.max_time_s (a judge's reward.judge.timeout_s): past it a sample ends with what it has,
    finish "abort", while the others of the call run to their own end and the engine stays usable."""
    ref, fast = engines(max_batch_size=4)
    spent = SamplingParams(temperature=0.0, max_new_tokens=20, max_time_s=1e-9)
    free = SamplingParams(temperature=0.0, max_new_tokens=6)
    for engine in (ref, fast):
        out = engine.generate([GenerationRequest([5, 6, 7], spent), GenerationRequest([5, 6, 7], free)])
        assert out[0][0].finish_reason == "abort" and 1 <= len(out[0][0].token_ids) < 20
        assert out[1][0].finish_reason == "length" and len(out[1][0].token_ids) == 6
        again = engine.generate([GenerationRequest([5, 6, 7], free)])
        assert again[0][0].token_ids == out[1][0].token_ids
