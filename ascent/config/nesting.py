"""Older flat `algorithm` settings into the nested choices of `ascent.config.choices`: `nest_choices` turns
`algorithm.clip_ratio_high: 0.28` into `policy_loss: {name: ppo, clip_ratio_high: 0.28}` and names every
setting the chosen choice does not read; `misplaced_options` refuses plug-in options that shadow ascent's own
settings. Imports without torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from pydantic import BaseModel

from ascent.config.choices import CHOICE_FIELDS, Choice, PluginChoice, name_of
from ascent.config.errors import show_value

# The flat settings of each choice in the last version before the unions; its resolved config.yaml lists
# every one of them (frozen: a member's newer fields are not in those files).
LEGACY_FLAT: dict[str, tuple[str, ...]] = {
    "policy_loss": (
        "clip_ratio_low",
        "clip_ratio_high",
        "dual_clip_c",
        "gspo_clip_low",
        "gspo_clip_high",
        "cispo_eps_low",
        "cispo_eps_high",
        "sapo_tau_pos",
        "sapo_tau_neg",
    ),
    "advantage": ("scale_by_std", "std_over_batch", "gamma", "lam", "gae_whiten"),
}


class Nested(NamedTuple):
    """What `nest_choices` made of an `algorithm` mapping."""

    data: dict[str, Any]  # each choice as {name: ..., its settings}
    problems: list[str]  # refuse the config (each names the field, the value and the fix)
    warnings: list[str]  # settings of an older resolved config.yaml that were dropped


def nest_choices(algorithm: dict[str, Any], strict: bool = True) -> Nested:
    """The `algorithm` section's mapping with each choice as `{name: ..., its settings}`.

    A flat setting of a member (`clip_ratio_high: 0.28`, the older form) moves into the chosen choice when
    it reads it. One it does not read is a problem (a setting that would do nothing), except one at its
    default when the choice is a built-in; with a plug-in, whose settings are in `algorithm.options`, any
    flat setting is a problem. A section that lists every flat setting of a choice (`LEGACY_FLAT`) is the
    resolved config.yaml of an older version (the one `--resume` asks for): what its choice does not read is
    dropped, with a warning when it mattered. `strict=False` drops it in any section and reports no problem
    (reading the config saved in old checkpoints).
    """
    out = dict(algorithm)
    problems: list[str] = []
    warnings: list[str] = []
    for field, (choices, default) in CHOICE_FIELDS.items():
        lenient = not strict or all(key in out for key in LEGACY_FLAT[field])
        found, dropped = _nest_one(out, field, choices, default, strict, lenient)
        problems += found
        warnings += dropped
    return Nested(out, problems if strict else [], warnings)


def _nest_one(
    data: dict[str, Any],
    field: str,
    choices: dict[str, type[Choice]],
    default: str,
    strict: bool,
    lenient: bool,
) -> tuple[list[str], list[str]]:
    """Nest `data[field]`; (problems, warnings). `lenient`: drop flat settings the choice does not read."""
    raw = data.get(field)
    raw = default if raw is None else raw
    if isinstance(raw, BaseModel):  # a member already (validate_assignment hands over the others as they are)
        if not any(key in data for key in _settings(choices)):
            return [], []
        raw = raw.model_dump()
    choice = {"name": raw} if isinstance(raw, str) else dict(raw) if isinstance(raw, dict) else None
    if choice is None or not isinstance(choice.setdefault("name", default), str):
        return [], []  # not a choice at all: pydantic names the value
    name = choice["name"]
    if name not in choices and ":" not in name and strict:
        return [
            f"algorithm.{field}={name!r}: unknown; use one of {', '.join(sorted(choices))} (or an import "
            "path `pkg.module:function`)."
        ], []
    member = choices.get(name, PluginChoice)
    problems: list[str] = []
    unread: dict[str, Any] = {}
    for key in [k for k in _settings(choices) if k in data]:
        value = data.pop(key)
        if key in member.model_fields:
            problems += _lift(field, choice, key, value)
        elif member is PluginChoice or value != _default(choices, key):
            unread[key] = value  # a plug-in got ascent's value before the unions, so even a default counts
    for key in [k for k in choice if k not in member.model_fields]:
        problems += _stray(field, choice, member, key, choices, strict)
    data[field] = choice
    if lenient:
        return problems, [_dropped(field, name, unread)] if unread else []
    return problems + [_unread(f"algorithm.{k}", field, name, k, v, choices) for k, v in unread.items()], []


def _settings(choices: dict[str, type[Choice]]) -> list[str]:
    """Every setting of any member, in declaration order (each once)."""
    return list(dict.fromkeys(k for m in choices.values() for k in m.model_fields if k != "name"))


def _readers(choices: dict[str, type[Choice]], key: str) -> list[str]:
    """The names of the members that read setting `key`."""
    return [n for n, m in choices.items() if key in m.model_fields and key != "name"]


def _default(choices: dict[str, type[Choice]], key: str) -> Any:
    return choices[_readers(choices, key)[0]].model_fields[key].default


def _lift(field: str, choice: dict[str, Any], key: str, value: Any) -> list[str]:
    """Move the flat `algorithm.<key>` into `choice`, which reads it; the problem when both differ."""
    if key in choice and choice[key] != value:
        return [
            f"algorithm.{key}={show_value(value)} and algorithm.{field}.{key}={show_value(choice[key])}: "
            f"two values for one setting; keep only algorithm.{field}.{key}."
        ]
    choice[key] = value
    return []


def _stray(
    field: str,
    choice: dict[str, Any],
    member: type[Choice],
    key: str,
    choices: dict[str, type[Choice]],
    strict: bool,
) -> list[str]:
    """A nested `algorithm.<field>.<key>` that `member` does not declare: the problem, or dropped."""
    if strict and member is not PluginChoice and not _readers(choices, key):
        return []  # unknown to every member: pydantic reports the unknown key
    value = choice.pop(key)
    if not strict:
        return []
    if member is PluginChoice:
        return [
            f"algorithm.{field}.{key}={show_value(value)}: a plug-in's settings go under algorithm.options; "
            f"move it to algorithm.options.{key}."
        ]
    return [_unread(f"algorithm.{field}.{key}", field, choice["name"], key, value, choices)]


def _who(readers: list[str]) -> str:
    return readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} or {readers[-1]}"


def _unread(where: str, field: str, name: str, key: str, value: Any, choices: dict[str, type[Choice]]) -> str:
    """`algorithm.gspo_clip_low=0.001: only policy_loss=gspo reads it, and this run's policy_loss is ppo;
    ...`"""
    readers = _readers(choices, key)
    head = f"{where}={show_value(value)}: only {field}={_who(readers)} reads it, and this run's {field} is"
    if ":" in name:
        return (
            f"{head} the plug-in {name!r}, whose settings go under algorithm.options; remove it or move it "
            f"to algorithm.options.{key}."
        )
    return f"{head} {name}; remove it or set {field}: {{name: {readers[0]}, {key}: {show_value(value)}}}."


def _dropped(field: str, name: str, unread: dict[str, Any]) -> str:
    """The warning for the flat settings of an older resolved config that `field`'s choice does not read."""
    listed = ", ".join(f"{key}={show_value(value)}" for key, value in unread.items())
    head = f"algorithm: ignoring {listed} (an older version's config.yaml, which lists every setting flat)"
    if ":" in name:
        return (
            f"{head}: this run's {field} is the plug-in {name!r}, which takes its settings from "
            "algorithm.options only; set algorithm.options.<key> for each it should get."
        )
    return (
        f"{head}: this run's {field} is {name}, which does not read {'it' if len(unread) == 1 else 'them'}."
    )


def misplaced_options(algorithm: dict[str, Any], shared: Iterable[str]) -> list[str]:
    """Problems for keys of `algorithm.options` (a plug-in's own settings) that name one of ascent's settings:
    a field of the section (`shared`) or a setting of a built-in member whose field has a built-in chosen
    (it would override the choice's own value, or reach a function it was not meant for). A setting of a
    member is a plug-in's when its field's choice is that plug-in. `algorithm`: nested (`nest_choices`)."""
    options = algorithm.get("options")
    if not isinstance(options, dict):
        return []
    shared = set(shared)
    problems = []
    for key, value in options.items():
        where = f"algorithm.options.{key}={show_value(value)}"
        if key in shared:
            problems.append(f"{where}: a setting of algorithm itself; set algorithm.{key} instead.")
            continue
        for field, (choices, default) in CHOICE_FIELDS.items():
            name = name_of(algorithm.get(field)) or default
            readers = _readers(choices, str(key))
            if not readers or name not in choices:  # none reads it, or a plug-in (or unknown) is chosen
                continue
            if name in readers:
                problems.append(f"{where}: a setting of {field}={name}; set algorithm.{field}.{key} instead.")
            else:
                problems.append(
                    f"{where}: a setting of {field}={_who(readers)}, and this run's {field} is {name}; "
                    "algorithm.options holds a plug-in's own settings, under names no built-in setting uses: "
                    f"remove it, or set {field}: {{name: {readers[0]}, {key}: {show_value(value)}}}."
                )
    return problems
