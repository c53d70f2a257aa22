"""The loop records what became of every episode: `Collector.collect` records the stale, the signal-less (DAPO
dynamic sampling), the groups a group hook filtered and the surplus groups it left out, `record_trained` the trained ones with their advantages
(zero-advantage episodes taken out of the loss as filtered); nothing is recorded when the store is off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ascent.config import RunConfig
from ascent.messages import Episode, Group, SamplingParams, TrainSample, flatten
from ascent.orchestrator import experience
from ascent.orchestrator.collector import Collector
from ascent.orchestrator.group_hooks import build_group_hooks
from ascent.orchestrator.sampling import RolloutStats, Scorer
from ascent.orchestrator.sources import PromptSource
from ascent.rewards import RewardRunner
from ascent.tracking import Timeline
from ascent.tracking.experience_store import FILE_NAME, open_store


def ep(text: str, row: int, version: int = 0) -> Episode:
    return Episode(
        prompt_ids=[1, row],
        response_ids=[5, 6],
        sampler_logprobs=[-0.5, -0.25],
        loss_mask=[1, 1],
        finish_reason="stop",
        row_id=row,
        policy_version=version,
        token_versions=[version] * 2,
        response_text=text,
        metadata={"answer": "4"},
    )


def group(row: int, *texts: str, version: int = 0) -> Group:
    return Group(tuple(ep(t, row, version) for t in texts))


SCORER = Scorer(RewardRunner("exact_match"), decode=lambda ids: "")


class Batches(Collector):
    """A collector whose batches are given (nothing is sampled); staleness is the real collector's."""

    def __init__(self, batches: list[list[Group]]) -> None:
        source = PromptSource(None, SCORER)  # type: ignore[arg-type]  # scores; samples nothing
        super().__init__(source, [], SamplingParams(), seed=0, max_staleness=0, stale_groups="drop")
        self.batches = batches

    def next_batch(self, sampler: Any, it: int, batch: int) -> tuple[list[Group], RolloutStats]:
        return self.batches[batch], RolloutStats(engine_idle_s=0.0)


class Tokenizer:
    """Decodes ids as the numbers they are."""

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return " ".join(map(str, ids))


def config(tmp_path: Path, **algorithm: Any) -> RunConfig:
    return RunConfig(
        run_dir=str(tmp_path),
        rollout={"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
        train={"trajectories_per_update": 4},
        algorithm=algorithm,
    )


def test_collect_groups_records_the_groups_it_leaves_out(tmp_path: Path) -> None:
    batches = [
        [group(0, "4", "4"), group(1, "4", "5"), group(2, "4", "5", version=-1)],  # equal rewards; ok; stale
        [group(3, "5", "4"), group(4, "4", "x")],  # ok; one more than the batch needs
    ]
    cfg = config(tmp_path, dynamic_sampling=True)
    col = Batches(batches)
    with experience.recording(cfg, Tokenizer(), start=0) as log:
        kept, _ = col.collect(cfg, col.source, Timeline(None), log, sampler=None, it=1)
        assert [g.row_id for g in kept] == [1, 3]
        samples = [TrainSample(e.prompt_ids, e.response_ids, e.loss_mask, [0.5, 1.5]) for e in flatten(kept)]
        experience.record_trained(log, 1, kept, samples)
    with open_store(tmp_path) as store:
        got = [(r.row_id, r.status, r.group_index, r.advantage) for r in store.episodes()]
        reasons = {r.status: r.drop_reason for r in store.episodes(status="dropped")}
    assert got == [
        (2, "dropped_stale", None, None),
        (2, "dropped_stale", None, None),
        (0, "filtered", None, None),
        (0, "filtered", None, None),
        (4, "surplus", None, None),
        (4, "surplus", None, None),
        (1, "trained", 0, 1.0),
        (1, "trained", 0, 1.0),
        (3, "trained", 1, 1.0),
        (3, "trained", 1, 1.0),
    ]
    assert "rollout.max_staleness=0" in reasons["dropped_stale"] and "dynamic_sampling" in reasons["filtered"]


def test_group_hooks_shape_and_filter_each_batch_and_their_drops_are_recorded(tmp_path: Path) -> None:
    """reward.group_hooks: the filter's dropped groups are replaced by the next batch, counted over both
    batches and recorded as filtered; the bonus is a reward component, its mean over the episodes it shaped."""
    called = replace(ep("4", 1), metadata={"answer": "4", "tool_calls": 1})
    batches = [
        [group(0, "4", "4"), Group((called, ep("5", 1)))],  # all right: filtered; half right
        [group(2, "5", "5"), group(3, "4", "5")],  # all wrong: filtered; half right
    ]
    cfg = config(tmp_path)
    cfg.reward.group_hooks = [
        {"name": "difficulty_filter", "low": 0.1, "high": 0.9},
        {"name": "curiosity", "target_rate": 1.0, "alpha": 1.0},
    ]
    col = Batches(batches)
    col.hooks = build_group_hooks(cfg.reward.group_hooks)
    with experience.recording(cfg, Tokenizer(), start=0) as log:
        kept, metrics = col.collect(cfg, col.source, Timeline(None), log, sampler=None, it=1)
    assert [g.row_id for g in kept] == [1, 3]
    # row 1: rate 1/2, the caller gets 1.0 * (1.0 - 0.5); row 3: nobody called
    assert [[e.reward for e in g.episodes] for g in kept] == [[1.5, 0.0], [1.0, 0.0]]
    assert kept[0].episodes[0].reward_components == {"curiosity": 0.5}
    assert metrics["reward/curiosity/mean"] == 0.5 / 4  # over the 4 episodes the bonus was computed for
    assert (
        metrics["reward/difficulty_filter/dropped_groups"] == 2.0 and metrics["rollout/sample_batches"] == 2
    )
    with open_store(tmp_path) as store:
        dropped = [(r.row_id, r.status, r.drop_reason) for r in store.episodes(status="dropped")]
    reason = "reward.group_hooks[0] (difficulty_filter) filtered it"
    assert dropped == [(0, "filtered", reason)] * 2 + [(2, "filtered", reason)] * 2


def test_zero_advantage_episodes_are_recorded_as_filtered(tmp_path: Path) -> None:
    cfg = config(tmp_path, filter_zero_advantage=True)
    groups = [group(0, "4", "5"), group(1, "4", "4")]
    masked = [TrainSample([1], [5, 6], [1, 1], [1.0, 1.0])] * 2 + [
        TrainSample([1], [5, 6], [0, 0], [0.0, 0.0])
    ] * 2
    with experience.recording(cfg, Tokenizer(), start=0) as log:
        experience.record_trained(log, 3, groups, masked)
    with open_store(tmp_path) as store:
        assert [(r.status, r.iteration, r.trainer_version) for r in store.episodes()] == (
            [("trained", 3, 2)] * 2 + [("filtered", 3, 2)] * 2
        )
        assert "zero_advantage" in str(store.episode(3).drop_reason)
        assert store.episode(1).prompt_text == "1 0"  # decoded on the writer's thread


def test_nothing_is_written_when_the_store_is_off(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg.tracking.experience_store = False
    with experience.recording(cfg, Tokenizer(), start=0) as log:
        assert log.writer is None
        experience.record_trained(log, 1, [group(0, "4")], [TrainSample([1], [5, 6], [1, 1], [0.0, 0.0])])
    assert not (tmp_path / FILE_NAME).exists()
