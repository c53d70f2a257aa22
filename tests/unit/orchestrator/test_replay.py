"""Replay: stored groups read back whole with their logprobs and versions, drawn in proportion to their
score (seeded by iteration), mixed with the fresh groups at the configured ratio; the config rules."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ascent.config import RunConfig
from ascent.config.replay import REPLAY_SCORES
from ascent.messages import Episode, Group
from ascent.orchestrator.replay import (
    REPLAYED_FROM,
    SCORES,
    Replay,
    ReplayError,
    ReplaySpec,
    load_replay,
    mix,
    recent,
    reward_variance,
)
from ascent.orchestrator.specs import collect_spec, fresh_prompts_per_step
from ascent.transport.store_writer import Entry
from tests.unit.transport.test_store import single, write


def group(*rewards: float, version: int = 0, row: int = 0) -> Group:
    return Group(tuple(single(row, r, version=version) for r in rewards))


def replay_cfg(**replay) -> RunConfig:
    return RunConfig(
        data={"train_path": "x.jsonl"},
        rollout={"prompts_per_step": 4, "samples_per_prompt": 2},
        train={"trajectories_per_update": 8},
        algorithm={"rollout_correction": "tis"},
        replay={"store": "runs/a", **replay},
    )


def test_draws_follow_the_weights_and_zero_is_never_drawn():
    groups = [group(1.0, row=i) for i in range(5)]
    replay = Replay(groups, [1.0, 2.0, 3.0, 4.0, 0.0], per_iteration=1, seed=7)
    counts = Counter(replay.draw(it)[0].row_id for it in range(1, 4001))
    assert 4 not in counts
    for row, share in ((0, 0.1), (1, 0.2), (2, 0.3), (3, 0.4)):
        assert abs(counts[row] / 4000 - share) < 0.03, counts


def test_an_iteration_draws_distinct_groups_the_same_way_every_time():
    replay = Replay([group(1.0, row=i) for i in range(6)], [1.0] * 6, per_iteration=3, seed=1)
    drawn = [g.row_id for g in replay.draw(5)]
    assert len(set(drawn)) == 3
    assert [g.row_id for g in replay.draw(5)] == drawn  # a resumed run draws them again: no state to save
    assert any([g.row_id for g in replay.draw(it)] != drawn for it in range(6, 12))


def test_too_few_groups_with_weight_is_an_error():
    with pytest.raises(ReplayError, match="1 stored groups have a weight above 0, fewer than the 2"):
        Replay([group(1.0), group(1.0)], [1.0, 0.0], per_iteration=2, seed=0)


def test_mix_appends_the_drawn_groups_and_reports_them():
    replay = Replay([group(1.0, 0.0, row=9)], [1.0], per_iteration=1, seed=0)
    fresh = [group(0.0, 0.0, row=1), group(1.0, 1.0, row=2)]
    mixed, metrics = mix(replay, fresh, it=1)
    assert [g.row_id for g in mixed] == [1, 2, 9]
    assert metrics == {"replay/groups": 1.0, "replay/mean_reward": 0.5}
    assert mix(None, fresh, it=1) == (fresh, {})


def test_the_ratio_splits_prompts_per_step_exactly():
    cfg = replay_cfg(ratio=0.25)
    assert fresh_prompts_per_step(cfg) == 3 and collect_spec(cfg).prompts_per_step == 3
    assert ReplaySpec.of(cfg) == ReplaySpec("runs/a", 1, "uniform", 2, 0)
    assert fresh_prompts_per_step(replay_cfg(ratio=0.75)) == 1
    off = replay_cfg(store=None)
    assert fresh_prompts_per_step(off) == 4 and ReplaySpec.of(off) is None


@pytest.mark.parametrize(
    ("replay", "algorithm", "message"),
    [
        ({"ratio": 0.3}, {}, "replay.ratio=0.3: with rollout.prompts_per_step=4 that is 1.2 stored groups"),
        ({}, {"rollout_correction": "none"}, "set algorithm.rollout_correction to tis or mis"),
        ({}, {"advantage": "remax"}, "stored groups have no greedy baseline"),
        ({"store": None, "ratio": 0.5}, {}, "replay.ratio=0.5: replay.store is not set"),
    ],
)
def test_config_rules(replay, algorithm, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        RunConfig(
            data={"train_path": "x.jsonl"},
            rollout={"prompts_per_step": 4, "samples_per_prompt": 2},
            algorithm={"rollout_correction": "tis", **algorithm},
            replay={"store": "runs/a", **replay},
        )


def test_built_in_scores():
    assert set(SCORES) == set(REPLAY_SCORES)
    assert reward_variance(group(1.0, 1.0)) == 0.0 and reward_variance(group(1.0, 0.0)) == 0.25
    assert recent(group(1.0, version=4)) == 5.0


def store_of(tmp_path: Path) -> Path:
    """Iteration 1: groups 0 (rows 3) and 1 (row 4, one episode filtered: partial); iteration 2: group 0
    (row 5), a replay itself; group 1 (row 6, versions 1)."""
    eps = {
        (1, 0): [single(3, 1.0), single(3, 0.0)],
        (1, 1): [single(4, 1.0)],
        (2, 0): [Episode(**{**vars(single(5, 1.0)), "metadata": {REPLAYED_FROM: {"episode": 1}}})] * 2,
        (2, 1): [single(6, 0.5, version=1), single(6, 0.0, n=5, version=1)],
    }
    entries = [Entry(e, it, "trained", it - 1, group_index=g) for (it, g), es in eps.items() for e in es]
    entries.append(Entry(single(4, 0.0), 1, "filtered", 0, group_index=1, reason="zero advantage"))
    return write(tmp_path / "experience.db", entries)


def test_stored_groups_come_back_whole_with_logprobs_versions_and_a_mark(tmp_path):
    path = store_of(tmp_path)
    replay = load_replay(ReplaySpec(str(tmp_path), 1, "recent", samples_per_prompt=2, seed=0))
    assert [g.row_id for g in replay.groups] == [3, 6]  # not the partial group, nor the replay
    assert list(replay.p) == [1 / 3, 2 / 3]  # recent: versions 0 and 1
    ep = replay.groups[1].episodes[1]
    want = single(6, 0.0, n=5, version=1)
    assert (ep.response_ids, ep.sampler_logprobs, ep.token_versions) == (
        want.response_ids,
        want.sampler_logprobs,
        want.token_versions,
    )
    assert ep.policy_version == 1 and ep.reward == 0.0 and ep.loss_mask == want.loss_mask
    assert ep.metadata[REPLAYED_FROM] == {"store": str(path), "episode": 7, "iteration": 2}


def test_a_store_without_groups_of_the_run_size_and_bad_scores_are_errors(tmp_path, monkeypatch):
    store_of(tmp_path)
    (tmp_path / "replay_scores.py").write_text("def negative(group):\n    return -1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ReplayError, match="no whole trained group of rollout.samples_per_prompt=4"):
        load_replay(ReplaySpec(str(tmp_path), 1, "uniform", samples_per_prompt=4, seed=0))
    with pytest.raises(
        ReplayError, match="replay.score='replay_scores:negative' gave -1.0 for a group of row 3"
    ):
        load_replay(ReplaySpec(str(tmp_path), 1, "replay_scores:negative", samples_per_prompt=2, seed=0))
    with pytest.raises(ReplayError, match="2 stored groups have a weight above 0, fewer than the 3"):
        load_replay(ReplaySpec(str(tmp_path), 3, "uniform", samples_per_prompt=2, seed=0))
    with pytest.raises(ReplayError, match="replay.score='operator:neg' raised TypeError"):
        load_replay(ReplaySpec(str(tmp_path), 1, "operator:neg", samples_per_prompt=2, seed=0))


def test_a_vision_language_group_replays_with_its_images_stored_once_each(tmp_path):
    """Each distinct image (by digest) is stored once, with its patches; every episode replays with its own
    images in order: the prompt's image its group shares, and a tool's image of one episode only."""
    import sqlite3

    import numpy as np
    import torch

    from ascent.messages import ImageInput
    from ascent.tracking.experience_store import open_store

    shared = ImageInput(torch.arange(12, dtype=torch.bfloat16).reshape(2, 6), (1, 1, 2), 1, "a" * 64, "row 3")
    zoom = ImageInput(np.full((4, 6), 0.25, dtype=np.float32), (1, 2, 2), 1, "b" * 64, "turn 2: zoom_in")
    eps = [
        Episode(**{**vars(single(3, 1.0)), "images": (shared, zoom)}),
        Episode(**{**vars(single(3, 0.0)), "images": (shared,)}),
    ]
    path = write(tmp_path / "experience.db", [Entry(e, 1, "trained", 0, group_index=0) for e in eps])
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM images").fetchone()[0] == 2
    replay = load_replay(ReplaySpec(str(tmp_path), 1, "uniform", samples_per_prompt=2, seed=0))
    first, second = replay.groups[0].episodes
    assert [i.digest for i in first.images] == ["a" * 64, "b" * 64] and len(second.images) == 1
    assert (first.images[1].grid_thw, first.images[1].num_tokens, first.images[1].source) == (
        (1, 2, 2),
        1,
        "turn 2: zoom_in",
    )
    np.testing.assert_array_equal(first.images[0].pixel_values, np.arange(12, dtype=np.float32).reshape(2, 6))
    np.testing.assert_array_equal(first.images[1].pixel_values, zoom.pixel_values)
    with open_store(tmp_path) as store:  # a text episode has none
        assert store.images(10_000) == ()
