"""Weight swaps between decode steps: a publication from another thread lands at a step boundary of a running
`generate`; every token records the version that sampled it, and greedy tokens on either side of the swap are
exactly what the old and the new weights produce (in-flight sequences keep their K/V, or restart)."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams

SWAP_AFTER_STEP = 5  # the publication waits inside decode step 5; it lands before step 6


def _requests() -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(11)
    shapes = [(9, 2, 18), (6, 1, 3), (14, 1, 16), (5, 3, 12), (21, 1, 20), (7, 2, 14)]  # (prompt, n, max_new)
    return [
        GenerationRequest(
            torch.randint(4, 60, (p,), generator=g).tolist(),
            SamplingParams(temperature=0.0, max_new_tokens=m, n=n),
            request_id=i,
            session_id="s0" if i == 0 else None,
        )
        for i, (p, n, m) in enumerate(shapes)
    ]


def _new_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A different policy: the MLPs and queries scaled (what an optimizer step could do, only larger)."""
    return {n: t * 0.5 for n, t in model.state_dict().items() if "mlp" in n or "q_proj" in n}


def _generate_with_a_swap(fast, reqs, new, monkeypatch, publish=None):
    """Run `generate` on a thread; publish `new` as version 1 from this thread (or call `publish()`) while
    decode step SWAP_AFTER_STEP runs (that step holds until the publication waits for the weights)."""
    with fast.publication(0):  # name the version of the weights the engine starts with
        pass
    reached, real, steps = threading.Event(), fast.runner.decode, [0]

    def decode(*args, **kwargs):
        steps[0] += 1
        if steps[0] == SWAP_AFTER_STEP:
            reached.set()
            deadline = time.monotonic() + 30
            while not fast.swaps.gate.waiting:  # the publisher is blocked on the gate this step holds
                assert time.monotonic() < deadline, "the publication never started waiting"
                time.sleep(0.001)
        return real(*args, **kwargs)

    monkeypatch.setattr(fast.runner, "decode", decode)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(fast.generate, reqs)
        assert reached.wait(60), "generation never reached the step"
        if publish is not None:
            publish()
        else:
            with fast.publication(1):
                fast.update_weights(new.items())
        out = running.result(timeout=120)
    return out


def _new_model(old: torch.nn.Module, new: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = copy.deepcopy(old)
    with torch.no_grad():
        state = model.state_dict()
        for name, t in new.items():
            state[name].copy_(t)
    return model


def _greedy_with_swap(old, new, prompt: list[int], tokens: list[int], a: int) -> list[int]:
    """Greedy tokens when tokens[:a] were sampled with `old` and the rest with `new` over the K/V the old
    weights wrote: step a reads token a-1 with the new weights, the positions before keep old K/V."""
    ids, p = torch.tensor([prompt + tokens]), len(prompt)
    with torch.no_grad():
        if a == 0:
            return new(input_ids=ids).logits[0, p - 1 : -1].argmax(-1).tolist()
        before = old(input_ids=ids[:, : p + a - 1], use_cache=True)
        got = before.logits[0, p - 1 :].argmax(-1).tolist()
        if a < len(tokens):
            after = new(input_ids=ids[:, p + a - 1 :], past_key_values=before.past_key_values).logits
            got += after[0, :-1].argmax(-1).tolist()
    return got


def test_inflight_sequences_continue_with_the_new_weights(engines, monkeypatch):
    ref, fast = engines(max_batch_size=4)
    reqs, new = _requests(), _new_weights(ref.model)
    out = _generate_with_a_swap(fast, reqs, new, monkeypatch)
    new_model = _new_model(ref.model, new)
    mixed = after = 0
    for req, gens in zip(reqs, out, strict=True):
        assert len(gens) == req.params.n  # nothing lost
        for g in gens:
            assert len(g.token_ids) == len(g.logprobs) == len(g.token_versions) > 0
            assert g.finish_reason == "stop" or len(g.token_ids) == req.params.max_new_tokens
            a = g.token_versions.count(0)
            assert g.token_versions == [0] * a + [1] * (len(g.token_ids) - a)  # the version changes once
            mixed += 0 < a < len(g.token_ids)
            after += a == 0
            assert g.token_ids == _greedy_with_swap(ref.model, new_model, req.prompt_ids, g.token_ids, a)
    assert mixed >= 3 and after >= 1 and [0] * 3 in [g.token_versions for g in out[1]]  # done before the swap
    assert fast.stats["swaps"] == 1 and fast.stats["restarted"] == 0
    assert "s0" not in fast.sessions.entries  # its K/V mixes two weight versions: not kept for a next turn
    assert fast.alloc.reserved == 0 and fast.alloc.available == fast.cache.num_pages - 1
    assert fast.swaps.version == 1


def test_restart_samples_inflight_sequences_again_with_the_new_weights(engines, monkeypatch):
    ref, fast = engines(max_batch_size=4, on_swap="restart")
    reqs, new = _requests(), _new_weights(ref.model)
    before = [[g.token_ids for g in gens] for gens in ref.generate(reqs)]
    out = _generate_with_a_swap(fast, reqs, new, monkeypatch)
    ref.update_weights(list(new.items()))
    after = [[g.token_ids for g in gens] for gens in ref.generate(reqs)]
    versions = set()
    for i, gens in enumerate(out):
        for j, g in enumerate(gens):
            assert len(set(g.token_versions)) == 1  # one version per sequence: none continued across
            versions.add(g.token_versions[0])
            assert g.token_ids == (before if g.token_versions[0] == 0 else after)[i][j]
    assert versions == {0, 1} and fast.stats["restarted"] >= 3
    assert "s0" in fast.sessions.entries  # sampled again on the new weights only: kept for a next turn
    fast.sessions.clear()
    assert fast.alloc.reserved == 0 and fast.alloc.available == fast.cache.num_pages - 1


def test_publication_from_a_live_callback_and_unversioned_calls(engines):
    """A publication made by the loop's own thread (a `more` callback) applies at that boundary; an engine
    no publisher gave a version leaves token_versions empty (its caller stamps them)."""
    ref, fast = engines(max_batch_size=4)
    reqs = _requests()
    assert all(g.token_versions == [] for gens in fast.generate(reqs) for g in gens)
    with fast.publication(3):
        pass
    new, polls, answers = _new_weights(ref.model), [0], {}

    def more(fits):
        polls[0] += 1
        if polls[0] == 4:
            with fast.publication(7):
                fast.update_weights(new.items())
        return []

    fast.generate_live(reqs, more, lambda i, samples: answers.__setitem__(i, samples))
    stamps = [g.token_versions for i in range(len(reqs)) for g in answers[i]]
    for v in stamps:
        assert v == [3] * v.count(3) + [7] * v.count(7) and len(v) > 0
    assert any(3 in v and 7 in v for v in stamps) and fast.stats["swaps"] == 1


def test_gate_hands_the_weights_over_only_at_a_boundary():
    """A publisher waits while a call holds the gate, gets it at the call's next boundary (the call waits
    until it is done), goes before a call that starts while it waits, and may take the gate again inside."""
    from ascent.rollout.fast.swap import SwapGate

    gate, log = SwapGate(), []

    def publish(tag: str) -> None:
        gate.acquire()
        gate.acquire()  # reentrant: update_weights inside a publication
        log.append(tag)
        gate.release()
        gate.release()

    gate.enter()
    publisher = threading.Thread(target=publish, args=("swap",))
    publisher.start()
    deadline = time.monotonic() + 10
    while not gate.waiting:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    log.append("step")  # the call keeps the weights until its boundary
    assert gate.boundary() and log == ["step", "swap"]
    assert not gate.boundary()  # nobody waiting: the call goes on at once
    gate.exit()
    publisher.join(5)
    gate.acquire()  # a publisher holds the gate: a call that starts waits for it
    caller = threading.Thread(target=lambda: (gate.enter(), log.append("call"), gate.exit()))
    caller.start()
    time.sleep(0.05)
    log.append("second swap")
    gate.release()
    caller.join(5)
    assert log == ["step", "swap", "second swap", "call"]


def test_a_publication_that_fails_partway_stops_generation_until_a_complete_one(engines, monkeypatch):
    """Half-copied weights never generate: the running call fails at its next boundary naming the failed
    publication (the publisher gets its own error), later calls fail at once, and a complete publication
    makes the engine usable again."""
    ref, fast = engines(max_batch_size=4)
    reqs, new = _requests(), _new_weights(ref.model)
    half = list(new.items())[: len(new) // 2]

    def publish_half() -> None:
        with pytest.raises(ConnectionError, match="bucket 2"), fast.publication(1):
            fast.update_weights(half)
            raise ConnectionError("bucket 2 of 2 was lost")

    broken = r"publication \(version 1\) failed partway \(ConnectionError: bucket 2 of 2 was lost\)"
    with pytest.raises(RuntimeError, match=broken):
        _generate_with_a_swap(fast, reqs, new, monkeypatch, publish_half)
    with pytest.raises(RuntimeError, match=broken):
        fast.generate(reqs)
    assert fast.alloc.reserved == 0 and fast.alloc.available == fast.cache.num_pages - 1
    assert fast.swaps.version == 0  # the failed publication's version was never the weights'
    monkeypatch.undo()
    with fast.publication(2):
        fast.update_weights(new.items())
    ref.update_weights(list(new.items()))
    out = fast.generate(reqs)
    assert [[g.token_ids for g in gens] for gens in out] == [
        [g.token_ids for g in gens] for gens in ref.generate(reqs)
    ]
    assert {v for gens in out for g in gens for v in g.token_versions} == {2}


def test_a_publication_that_fails_before_copying_gives_the_gate_back():
    """An error while the publication orders itself after the loop's stream (before any copy) reaches the
    publisher; the gate is free again and the weights are not marked broken."""
    from ascent.rollout.fast.swap import WeightSwaps

    swaps = WeightSwaps(torch.device("cuda"), on_publish=lambda: None)
    swaps._loop_stream = object()  # not a stream: wait_stream raises (as it does without a GPU here)
    with pytest.raises(Exception), swaps.publication(1):  # noqa: B017  # which error depends on the build
        pytest.fail("the block must not run")
    assert swaps.broken is None and swaps.epoch == 0 and swaps.version is None
    taken = threading.Event()
    threading.Thread(target=lambda: (swaps.gate.enter(), taken.set(), swaps.gate.exit())).start()
    assert taken.wait(5), "the gate was never given back"
