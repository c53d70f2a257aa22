"""The collector over any episode source (it only submits, ahead or not, and waits); a multi-turn source
plays ahead on its thread only when the replicas generate beside the trainer; the loop state a checkpoint
saves brings the sampler and the adaptive KL coefficient back."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from ascent.algorithms import AdaptiveKLController
from ascent.config import RunConfig
from ascent.data.sampler import PromptSampler
from ascent.messages import Episode, Group, SamplingParams
from ascent.orchestrator import health
from ascent.orchestrator.collector import Collector, CollectSpec, batch_seed
from ascent.orchestrator.run import LoopState
from ascent.orchestrator.sampling import RolloutStats
from ascent.orchestrator.sources import Pending, _MultiTurn


class Item:
    def __init__(self, row_id: int) -> None:
        self.row_id, self.prompt_ids, self.metadata = row_id, [row_id + 1], {}


def one_group(row_id: int) -> Group:
    return Group(
        (
            Episode(
                prompt_ids=[1],
                response_ids=[2],
                sampler_logprobs=[0.0],
                loss_mask=[1],
                finish_reason="stop",
                row_id=row_id,
            ),
        )
    )


class Recorded:
    """A source that records what it was asked and plays one episode per item at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int, bool]] = []
        self.closed = False

    def submit(self, items: list[Any], params: SamplingParams, seed: int, *, ahead: bool = False) -> Pending:
        self.calls.append(([i.row_id for i in items], seed, ahead))
        done: Future[tuple[list[Group], RolloutStats]] = Future()
        done.set_result(([one_group(i.row_id) for i in items], RolloutStats(engine_idle_s=0.0)))
        return done

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        return groups, {}

    def evaluate(self, items: Any, params: SamplingParams, seed: int) -> list[Group]:
        return []

    def close(self) -> None:
        self.closed = True


def test_the_collector_submits_to_its_source_and_prefetches_ahead() -> None:
    source, items = Recorded(), [Item(i) for i in range(6)]
    col = Collector(
        source, items, SamplingParams(n=1), CollectSpec(prompts_per_step=2, seed=3, max_staleness=1)
    )
    sampler = PromptSampler(len(items), 2, seed=0, shuffle=False)
    first, _ = col.next_batch(sampler, it=1, batch=0)
    col.prefetch(sampler, it=1, last=5)
    second, _ = col.next_batch(sampler, it=2, batch=0)  # the prefetched batch: nothing submitted now
    assert source.calls == [([0, 1], batch_seed(3, 1, 0), False), ([2, 3], batch_seed(3, 2, 0), True)]
    assert [g.row_id for g in first + second] == [0, 1, 2, 3]
    col.close()
    assert source.closed


class Threads(_MultiTurn):
    """Plays record the thread they ran on."""

    def play(self, items: list[Any], params: SamplingParams, seed: int) -> tuple[list[Group], RolloutStats]:
        return [], RolloutStats(
            0.0, {"on_main": float(threading.current_thread() is threading.main_thread())}
        )


def test_a_multi_turn_source_plays_ahead_on_a_thread_only_alongside_the_trainer() -> None:
    beside, turns = Threads(0.0, alongside=True), Threads(0.0, alongside=False)
    try:
        assert beside.submit([], SamplingParams(), 0, ahead=True).result()[1].metrics == {"on_main": 0.0}
        assert beside.submit([], SamplingParams(), 0).result()[1].metrics == {"on_main": 1.0}
        assert turns.submit([], SamplingParams(), 0, ahead=True).result()[1].metrics == {"on_main": 1.0}
    finally:
        beside.close()


def test_the_loop_state_comes_back_from_what_a_checkpoint_saves() -> None:
    def state() -> LoopState:
        return LoopState(
            PromptSampler(10, 2, seed=1),
            AdaptiveKLController(0.1, target=1.0, horizon=10),
            health.EqualRewardWatch(health.RunFacts.of(RunConfig())),
            health.DivergenceCheck(health.RunFacts.of(RunConfig()), 100),
        )

    run = state()
    run.sampler.next_batch()
    assert run.kl_controller is not None
    run.kl_controller.update(5.0, 4)
    saved = {"sampler": run.sampler.state_dict(), **run.state_dict()}
    resumed = state()
    resumed.load_state_dict(saved)
    assert resumed.kl_controller is not None and resumed.kl_controller.coef == run.kl_controller.coef != 0.1
    assert resumed.sampler.next_batch() == run.sampler.next_batch()
