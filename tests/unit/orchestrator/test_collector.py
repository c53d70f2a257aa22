"""The collector: per-episode staleness, drop and regenerate, prefetching ahead, the sampler state a
checkpoint saves, and the version every replica reports; on an inline group of scripted replicas (no
model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from ascent.cluster import make_worker_group
from ascent.cluster.base import WorkerGroup
from ascent.config import RunConfig
from ascent.data.sampler import PromptSampler
from ascent.messages import Episode, Generation, GenerationRequest, Group, SamplingParams, flatten
from ascent.orchestrator import batch as B
from ascent.orchestrator import collector as C
from ascent.orchestrator.sampling import Scorer
from ascent.orchestrator.shaping import Shaping
from ascent.orchestrator.sources import PromptSource
from ascent.orchestrator.workers import RolloutWorker
from ascent.rewards import RewardRunner


class ScriptedEngine:
    """Answers each request with `n` one-token responses: the prompt's first token."""

    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        return [[Generation([r.prompt_ids[0]], [-0.5], "stop") for _ in range(r.params.n)] for r in requests]

    def update_weights(self, named_tensors: Any) -> None:
        list(named_tensors)


class ScriptedReplica(RolloutWorker):
    """A rollout worker around the scripted engine (the real `generate` / `update_weights` run)."""

    def __init__(self) -> None:
        self.engine, self.version, self._last_end = ScriptedEngine(), 0, None


@dataclass
class Item:
    prompt_ids: list[int]
    row_id: int
    metadata: dict[str, Any] = field(default_factory=dict)


TRAIN = [Item([10 + i], row_id=i) for i in range(6)]


@pytest.fixture
def rollout(monkeypatch: pytest.MonkeyPatch) -> WorkerGroup[RolloutWorker]:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    return make_worker_group(ScriptedReplica, num_workers=1, backend="inline", name="rollout")


def collector(rollout: WorkerGroup[RolloutWorker], max_staleness: int, stale_groups: str) -> C.Collector:
    """A collector of single-turn prompts (`TRAIN`) sampled on the scripted replicas."""
    cfg = RunConfig(
        rollout={"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 1},
        train={"trajectories_per_update": 4},
    )
    source = PromptSource(rollout, Scorer(RewardRunner("exact_match"), decode=str))
    spec = C.CollectSpec(2, cfg.seed, max_staleness, stale_groups, shaping=Shaping(max_new_tokens=1))
    return C.Collector(source, TRAIN, B.sampling_params(cfg.rollout), spec)


def episode(versions: list[int], row_id: int = 0) -> Episode:
    return Episode(
        prompt_ids=[1],
        response_ids=[5] * len(versions),
        sampler_logprobs=[0.0] * len(versions),
        loss_mask=[1] * len(versions),
        finish_reason="stop",
        row_id=row_id,
        policy_version=min(versions),
        token_versions=versions,
    )


def test_staleness_counts_from_the_oldest_token() -> None:
    assert C.staleness(episode([3, 5, 5]), trainer_version=6) == 3
    assert C.staleness(episode([6]), trainer_version=6) == 0
    m = C.staleness_metrics([episode([4]), episode([6])], trainer_version=6)
    assert m == {"rollout/staleness_mean": 1.0, "rollout/staleness_max": 2.0}


@pytest.mark.parametrize("policy", ["drop", "regenerate"])
def test_a_group_with_one_stale_episode_is_taken_out_whole(rollout: Any, policy: str) -> None:
    col = collector(rollout, max_staleness=1, stale_groups=policy)
    fresh = Group((episode([4], 0), episode([4], 0)))
    mixed = Group(
        (episode([4], 1), episode([3, 4], 1))
    )  # one token sampled 2 versions behind the trainer (5)
    kept, dropped = col.split_stale([fresh, mixed], trainer_version=5)
    assert kept == [fresh] and dropped == 2
    assert [i.row_id for i in col._redo] == ([1] if policy == "regenerate" else [])


def test_regenerate_samples_the_same_prompts_with_the_current_weights(rollout: Any) -> None:
    col = collector(rollout, max_staleness=1, stale_groups="regenerate")
    sampler = PromptSampler(len(TRAIN), 2, seed=0)
    groups, _ = col.next_batch(sampler, it=1, batch=0)
    assert [len(g.episodes) for g in groups] == [2, 2] and all(
        len({e.row_id for e in g.episodes}) == 1 for g in groups
    )
    rows = [g.row_id for g in groups]
    rollout.call(RolloutWorker.update_weights, {}, 3)  # three publications later
    kept, dropped = col.split_stale(groups, trainer_version=3)
    assert kept == [] and dropped == 4
    state = sampler.state_dict()
    again, _ = col.next_batch(sampler, it=4, batch=1)
    assert [g.row_id for g in again] == rows and sampler.state_dict() == state  # no new draw
    assert {t.policy_version for t in flatten(again)} == {3} and all(
        t.token_versions == [3] for t in flatten(again)
    )


def test_prefetch_runs_ahead_and_a_checkpoint_saves_the_sampler_before_it(rollout: Any) -> None:
    """Staleness 2: after iteration 1, iterations 2 and 3 are submitted with version 0; the sampler state a
    checkpoint after iteration 1 saves is the one before those draws, so a resumed run draws them again."""
    col = collector(rollout, max_staleness=2, stale_groups="drop")
    sampler = PromptSampler(len(TRAIN), 2, seed=0)
    col.next_batch(sampler, it=1, batch=0)
    before = sampler.state_dict()
    col.prefetch(sampler, it=1, last=10)
    assert sorted(col._ahead) == [2, 3] and col.sampler_state(sampler, 1) == before
    assert sampler.state_dict() != before
    col.prefetch(sampler, it=1, last=10)  # idempotent: nothing is submitted twice
    assert sorted(col._ahead) == [2, 3]
    rollout.call(RolloutWorker.update_weights, {}, 1)
    groups, stats = col.next_batch(sampler, it=2, batch=0)
    assert {C.staleness(t, trainer_version=1) for t in flatten(groups)} == {1} and stats.engine_idle_s >= 0
    assert col.take_waited() > 0 and col.take_waited() == 0.0
    col.prefetch(sampler, it=9, last=10)  # never past the last iteration
    assert 11 not in col._ahead and 10 in col._ahead


def test_replicas_report_the_published_version_and_stamp_every_token(rollout: Any) -> None:
    assert rollout.call(RolloutWorker.update_weights, {}, 7) == [7]
    (rollout,) = rollout.call(
        RolloutWorker.generate, [GenerationRequest([4], SamplingParams(max_new_tokens=1))]
    )
    assert rollout.policy_version == 7 and rollout.generations[0][0].token_versions == [7]
    assert rollout.idle_s == 0.0  # the replica's first generate call
