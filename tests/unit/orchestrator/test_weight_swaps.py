"""Weight swaps between decode steps at the replica: `rollout.swap_mid_generation` reaches the loop and the
engine only where generation overlaps publication; a RolloutWorker publication that lands inside a generate
call is recorded token by token, and staleness stays per episode (its oldest token)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

from ascent.config import RunConfig
from ascent.messages import Episode, GenerationRequest, SamplingParams
from ascent.orchestrator import setup, specs
from ascent.orchestrator.batch import to_groups
from ascent.orchestrator.collector import staleness
from ascent.orchestrator.loop import swap_metrics
from ascent.orchestrator.workers import RolloutWorker
from ascent.rollout.specs import EngineSpec


def cfg(**sections) -> RunConfig:
    base = {"model": {"path": "m"}, "data": {"train_path": "d.jsonl"}, "rollout": {"engine": "fast"}}
    return RunConfig(**(base | sections))


@pytest.mark.parametrize(
    ("rollout", "cluster", "swaps"),
    [
        ({}, {"backend": "ray", "placement": "split"}, True),
        ({"swap_mid_generation": "restart"}, {"backend": "ray", "placement": "split"}, True),
        ({"swap_mid_generation": "off"}, {"backend": "ray", "placement": "split"}, False),
        ({}, {"backend": "ray", "placement": "colocated"}, False),  # the engine sleeps through the update
        ({}, {"backend": "inline", "placement": "split"}, False),  # one thread: nothing overlaps
        ({"engine": "reference"}, {"backend": "ray", "placement": "split"}, False),
    ],
)
def test_swaps_only_where_generation_overlaps_publication(rollout, cluster, swaps):
    c = cfg(rollout={"engine": "fast"} | rollout, cluster=cluster)
    assert setup.swaps_mid_generation(c) is swaps
    kw = specs.engine_spec(c).builder_kwargs()
    if c.rollout.engine == "fast":
        assert kw["on_swap"] == ("restart" if rollout.get("swap_mid_generation") == "restart" else "continue")
    else:
        assert "on_swap" not in kw  # the reference engine has no such option


def _episode(versions: list[int], mask: list[int] | None = None) -> Episode:
    n = len(versions)
    return Episode([1], [5] * n, [0.0] * n, mask or [1] * n, "stop", 0, min(versions, default=0), versions)


def test_swap_metrics_count_sequences_and_tokens_sampled_after_a_swap():
    eps = [
        _episode([2, 2, 3, 3, 3]),
        _episode([3, 3]),
        _episode([1, 1, 2, 2], mask=[1, 1, 0, 0]),
        _episode([]),
    ]
    assert swap_metrics(eps) == {"rollout/swapped_sequences": 1.0, "rollout/tokens_after_swap": 3.0}
    assert [staleness(e, trainer_version=3) for e in eps[:3]] == [1, 0, 2]  # the oldest token counts


@dataclass(frozen=True)
class _Item:
    prompt_ids: list[int]
    row_id: int
    metadata: dict


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    from ascent.models import make_tiny_checkpoint

    path = str(make_tiny_checkpoint(tmp_path_factory.mktemp("swap_model"), seed=4))
    options = {"max_model_len": 96, "page_size": 16, "max_batch_size": 8}
    return RolloutWorker(EngineSpec("fast", path, path, device="cpu", options=options))


@pytest.fixture()
def one_thread():
    """torch at one intra-op thread for this test only: set_num_threads is process-wide, and left at 1 it
    would change the thread count (so the float rounding of some kernels) of every later test in the run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_a_publication_lands_between_decode_steps_of_a_replicas_call(replica, monkeypatch):
    """The controller's publication (update_weights, sent alongside on Ray) arrives while the replica's
    generate call runs: it waits for the next decode step boundary, the call carries on with the new weights,
    and each token records the version that sampled it."""
    engine = replica.engine
    start = {n: t.clone() for n, t in engine.weights.targets.items()}
    replica.update_weights(start, version=4)
    reached, real, steps = threading.Event(), engine.runner.decode, [0]

    def decode(*args, **kwargs):
        steps[0] += 1
        if steps[0] == 6:
            reached.set()
            deadline = time.monotonic() + 30
            while not engine.swaps.gate.waiting:
                assert time.monotonic() < deadline, "the publication never waited for the weights"
                time.sleep(0.001)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "decode", decode)
    params = SamplingParams(temperature=1.0, max_new_tokens=30, n=4, seed=7)
    requests = [GenerationRequest(list(range(4, 4 + k)), params, request_id=i) for i, k in enumerate((6, 11))]
    new = {n: t * 0.9 for n, t in start.items()}
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(replica.generate, requests)
        assert reached.wait(60)
        assert replica.update_weights(new, version=5) == 5  # returns once the weights are in place
        rollout = call.result(timeout=120)
    assert rollout.policy_version == 4  # what the replica held when the call started
    items = [_Item(r.prompt_ids, i, {}) for i, r in enumerate(requests)]
    episodes = [e for g in to_groups(items, rollout.generations, decode=str) for e in g.episodes]
    assert len(episodes) == 8 and all(e.response_ids for e in episodes)
    for e in episodes:
        old = e.token_versions.count(4)
        assert e.token_versions == [4] * old + [5] * (len(e.response_ids) - old) and old > 0
        assert e.policy_version == 4 and staleness(e, trainer_version=5) == 1
    assert swap_metrics(episodes)["rollout/swapped_sequences"] >= 1
    assert replica.version == 5 and engine.swaps.version == 5
    after = replica.generate(requests[:1])  # the next call runs on version 5 only
    assert {v for g in after.generations[0] for v in g.token_versions} == {5}
