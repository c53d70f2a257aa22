"""`reward.group_hooks` from config to a batch: resolving built-ins and plug-ins (bad entries named), the
shaping recorded as a reward component with its mean, a filter's dropped groups counted and handed back as
they came in, and a hook that breaks costing its group, or the run when it breaks on every group."""

from __future__ import annotations

import inspect
import re

import pytest

from ascent.config import ConfigError
from ascent.config.group_hooks import GROUP_HOOK_CHOICES
from ascent.config.loader import validate_config
from ascent.messages import Episode, Group
from ascent.orchestrator.group_hooks import GroupHookError, HookTally, apply_group_hooks, build_group_hooks
from ascent.rewards.group_hooks import GROUP_HOOKS, add_to_rewards

HERE = "tests.unit.orchestrator.test_group_hooks"


def bonus(group: Group, *, amount: float = 1.0) -> Group:
    """A plug-in: `amount` more for every episode."""
    return add_to_rewards(group, [amount] * len(group.episodes))


def needs(group: Group, scale: float) -> Group:
    """A plug-in with a setting it cannot do without."""
    return add_to_rewards(group, [scale] * len(group.episodes))


def picky(group: Group) -> Group:
    """A plug-in that raises on the group of row 1 and leaves the others as they are."""
    if group.row_id == 1:
        raise RuntimeError("no tools here")
    return group


def broken(group: Group) -> Group:
    """A plug-in that breaks the protocol: it answers None."""
    return None  # type: ignore[return-value]


def hooks(*entries: object) -> list:
    return build_group_hooks(validate_config({"reward": {"group_hooks": list(entries)}}).reward.group_hooks)


def group(row: int, *entries: tuple[float, int]) -> Group:
    return Group(
        tuple(
            Episode([1], [2], [0.0], [1], "stop", row, reward=r, metadata={"tool_calls": c})
            for r, c in entries
        )
    )


def test_each_built_in_config_holds_the_functions_own_settings_and_defaults() -> None:
    for name, fn in GROUP_HOOKS.items():
        member = GROUP_HOOK_CHOICES[name]
        params = inspect.signature(fn).parameters
        settings = {k: f.default for k, f in member.model_fields.items() if k != "name"}
        assert set(settings) == set(params) - {"group"}, name
        assert all(params[k].default in (inspect.Parameter.empty, v) for k, v in settings.items()), name


def test_hooks_resolve_built_ins_and_plug_ins_with_their_settings() -> None:
    built = hooks("curiosity", {"name": "difficulty_filter", "low": 0.1, "high": 0.9}, f"{HERE}:bonus")
    assert [h.name for h in built] == ["curiosity", "difficulty_filter", "bonus"]
    assert built[0].settings == {"target_rate": 0.3, "alpha": 0.5, "beta": 0.05, "max_calls": 1}
    assert built[1].settings == {"low": 0.1, "high": 0.9} and built[2].settings == {}
    assert hooks({"name": f"{HERE}:bonus", "kwargs": {"amount": 2}})[0].settings == {"amount": 2}
    assert hooks({"name": f"{HERE}:needs", "kwargs": {"scale": 2}})[0].settings == {"scale": 2}


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([f"{HERE}:nothing"], "reward.group_hooks[0]="),
        (
            [{"name": f"{HERE}:bonus", "kwargs": {"amuont": 2}}],
            "reward.group_hooks[0].kwargs={amuont: 2}: bonus(group, **kwargs) cannot be called (got an "
            "unexpected keyword argument 'amuont')",
        ),
        ([f"{HERE}:needs"], "needs(group, **kwargs) cannot be called (missing a required argument: 'scale')"),
        (["curiosity", "curiosity"], "reward.group_hooks[1].name='curiosity': a second hook named"),
    ],
)
def test_bad_entries_are_named(entries: list, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        hooks(*entries)


def test_shaping_is_a_reward_component_with_its_mean_and_a_filter_counts_its_drops() -> None:
    # row 0: rate 1/2, row 1: rate 1/4 (mean reward 0.25), row 2: no caller (mean reward 1)
    batch = [
        group(0, (1.0, 1), (0.0, 0)),
        group(1, (1.0, 2), (0.0, 0), (0.0, 0), (0.0, 0)),
        group(2, (1.0, 0), (1.0, 0)),
    ]
    target = {"name": "curiosity", "target_rate": 0.75, "alpha": 1.0, "beta": 0.5}
    tally = HookTally()
    out = apply_group_hooks(
        hooks({"name": "difficulty_filter", "low": 0.0, "high": 0.5}, target), batch, tally
    )
    assert out.dropped == [(batch[2], "reward.group_hooks[0] (difficulty_filter) filtered it")]
    # row 0: caller + (0.75 - 0.5) = 0.25; row 1: caller + (0.75 - 0.25) - 0.5 * (2 - 1) = 0
    assert [[e.reward for e in g.episodes] for g in out.kept] == [[1.25, 0.0], [1.0, 0.0, 0.0, 0.0]]
    parts = [[e.reward_components for e in g.episodes] for g in out.kept]
    assert parts == [[{"curiosity": 0.25}, {"curiosity": 0.0}], [{"curiosity": 0.0}] * 4]
    assert tally.metrics() == {
        "reward/curiosity/mean": pytest.approx(0.25 / 6),
        "reward/difficulty_filter/dropped_groups": 1.0,
    }
    apply_group_hooks(hooks(target), [group(4, (0.0, 1), (0.0, 0))], tally)  # the caller gets 0.25 again
    assert tally.metrics()["reward/curiosity/mean"] == pytest.approx(0.5 / 8)  # over all 8 shaped episodes


def test_a_hook_that_breaks_costs_its_group_and_one_that_always_breaks_stops_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = [group(0, (1.0, 0)), group(1, (0.0, 1)), group(2, (0.5, 0))]
    tally = HookTally()
    out = apply_group_hooks(hooks(f"{HERE}:picky"), batch, tally)
    assert [g.row_id for g in out.kept] == [0, 2]
    assert out.dropped == [(batch[1], "reward.group_hooks[0] (picky) failed: RuntimeError: no tools here")]
    assert tally.metrics() == {"reward/picky/mean": 0.0, "reward/picky/errors": 1.0}
    with pytest.raises(GroupHookError, match=r"reward.group_hooks\[0\] \(broken\) failed on all 3 groups"):
        apply_group_hooks(hooks(f"{HERE}:broken"), batch, HookTally())
    assert "it returned NoneType; a hook returns the group" in caplog.text
