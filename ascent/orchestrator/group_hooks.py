"""Running the group hooks of `reward.group_hooks` on a scored batch (the protocol and the built-ins:
`ascent.rewards.group_hooks`).

`build_group_hooks` resolves the configured hooks once (built-in names from `GROUP_HOOKS`, import paths
through `ascent.plugins`; a plug-in's `fn(group, **kwargs)` must bind to its signature), so a typo fails at
start-up with the entry named. `apply_group_hooks` runs them in order on each group of a batch: a shaping hook's change to
each episode's reward is recorded as a reward component named after the hook, a filter's False drops the
group. A hook that raises or breaks the protocol costs its group (a warning, `reward/<name>/errors`), never
the run, unless it fails on every group of a batch (a broken hook, not a bad group: the run stops naming it).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ascent.config import ConfigError
from ascent.config.errors import show_value
from ascent.config.group_hooks import GroupHookPlugin
from ascent.errors import AscentError
from ascent.messages import Group, flatten
from ascent.plugins import resolve
from ascent.rewards.group_hooks import GROUP_HOOKS

log = logging.getLogger("ascent")


class GroupHookError(AscentError):
    """A group hook failed on every group of a batch."""


@dataclass(frozen=True)
class GroupHook:
    """One configured hook: its name (reward component and metric prefix), function, settings and the config
    entry it came from (`reward.group_hooks[i]`, for messages)."""

    name: str
    fn: Callable[..., Any]
    settings: dict[str, Any]
    field: str
    plugin: bool = False


@dataclass
class HookOutcome:
    """What the hooks did to one batch: the groups kept, and those dropped (as they came in, with the
    reason)."""

    kept: list[Group]
    dropped: list[tuple[Group, str]] = field(default_factory=list)


@dataclass
class HookTally:
    """The hooks' metrics over the batches of one iteration: each shaping hook's component over every episode
    it shaped (`reward/<name>/mean`), each filter's dropped groups (`reward/<name>/dropped_groups`) and each
    plug-in's errors (`reward/<name>/errors`), summed."""

    components: dict[str, list[float]] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        means = {f"reward/{k}/mean": sum(v) / len(v) for k, v in self.components.items() if v}
        return means | self.counts

    def count(self, key: str, n: int) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + n


def build_group_hooks(choices: Sequence[Any]) -> list[GroupHook]:
    """`reward.group_hooks` -> the hooks, resolved; ConfigError naming every bad entry."""
    hooks: list[GroupHook] = []
    problems: list[str] = []
    for i, choice in enumerate(choices):
        where = f"reward.group_hooks[{i}]"
        try:
            fn = resolve(GROUP_HOOKS, choice.name, where)
        except ValueError as err:  # names the entry, the value and the fix
            problems.append(str(err))
            continue
        plugin = isinstance(choice, GroupHookPlugin)
        settings = dict(choice.kwargs) if plugin else choice.model_dump(exclude={"name"})
        name = choice.name.rpartition(":")[2].rpartition(".")[2] if plugin else choice.name
        problems += _call_problems(fn, settings, where) if plugin else []
        if name in [h.name for h in hooks]:
            problems.append(
                f"{where}.name={choice.name!r}: a second hook named {name!r}; their reward components and "
                "metrics would collide. Give each hook once (a plug-in is named by its function)."
            )
        hooks.append(GroupHook(name, fn, settings, where, plugin))
    if problems:
        raise ConfigError(problems)
    return hooks


def _call_problems(fn: Callable[..., Any], kwargs: dict[str, Any], where: str) -> list[str]:
    """The problem when `fn(group, **kwargs)` could not be called: a keyword it does not take, or a
    parameter it needs that `kwargs` lacks."""
    try:
        inspect.signature(fn).bind(None, **kwargs)
    except TypeError as err:
        return [
            f"{where}.kwargs={show_value(kwargs)}: {getattr(fn, '__name__', fn)}(group, **kwargs) cannot be "
            f"called ({err}); its parameters are {inspect.signature(fn)}. Fix the kwargs or the function."
        ]
    except ValueError:  # no signature to read (a builtin): let the call say
        return []
    return []


def apply_group_hooks(hooks: Sequence[GroupHook], groups: Sequence[Group], tally: HookTally) -> HookOutcome:
    """Run `hooks` in order on every group of `groups` (see the module docstring); their metrics go to
    `tally`."""
    out = HookOutcome([])
    pairs = [(g, g) for g in groups]  # (as it came in, as the hooks so far left it)
    for hook in hooks:
        kept, shaped, filtered, dropped, errors = [], False, False, 0, 0
        for first, group in pairs:
            result = _call(hook, group)
            if isinstance(result, str):
                errors += 1
                out.dropped.append((first, f"{hook.field} ({hook.name}) failed: {result}"))
            elif isinstance(result, bool):
                filtered = True
                if result:
                    kept.append((first, group))
                else:
                    dropped += 1
                    out.dropped.append((first, f"{hook.field} ({hook.name}) filtered it"))
            else:
                shaped = True
                kept.append((first, _with_component(hook.name, group, result)))
        if errors and errors == len(pairs):
            raise GroupHookError(
                f"{hook.field} ({hook.name}) failed on all {errors} groups of a batch; the warnings above "
                "say how; fix the hook or remove it."
            )
        pairs = kept
        _tally(tally, hook, [g for _, g in pairs] if shaped else None, dropped if filtered else None, errors)
    out.kept = [g for _, g in pairs]
    return out


def _call(hook: GroupHook, group: Group) -> Group | bool | str:
    """The hook's answer for `group`, or why it broke the protocol (an exception, a wrong answer)."""
    try:
        result = hook.fn(group, **hook.settings)
    except Exception as err:  # user code: it costs this group, never the batch
        problem = f"{type(err).__name__}: {err}"
    else:
        if isinstance(result, bool):
            return result
        if isinstance(result, Group) and len(result.episodes) == len(group.episodes):
            return result
        problem = (
            f"it returned {type(result).__name__}; a hook returns the group (same episodes, rewards "
            "adjusted) or a bool (False drops the group)"
        )
    log.warning("%s (%s) on the group of row %d: %s", hook.field, hook.name, group.row_id + 1, problem)
    return problem


def _with_component(name: str, before: Group, after: Group) -> Group:
    """`after` with each episode's reward change since `before` recorded as reward component `name`."""
    episodes = tuple(
        replace(
            new,
            reward_components=new.reward_components
            | {name: new.reward_components.get(name, 0.0) + new.reward - old.reward},
        )
        for old, new in zip(before.episodes, after.episodes, strict=True)
    )
    return replace(after, episodes=episodes)


def _tally(
    tally: HookTally, hook: GroupHook, shaped: list[Group] | None, dropped: int | None, errors: int
) -> None:
    """Count what `hook` did to a batch: the components of the episodes it shaped, the groups it dropped as
    a filter, a plug-in's errors (a hook shapes or filters: only what it did is counted)."""
    prefix = f"reward/{hook.name}"
    if shaped is not None:
        tally.components.setdefault(hook.name, []).extend(
            e.reward_components[hook.name] for e in flatten(shaped)
        )
    if dropped is not None:
        tally.count(f"{prefix}/dropped_groups", dropped)
    if hook.plugin:
        tally.count(f"{prefix}/errors", errors)
