"""`ConfigError` and the translation of pydantic's validation errors into messages a user can act on.

Every problem becomes one line that names the dotted field, the bad value and the fix, e.g.
`train.lr=-1: must be > 0 (Peak learning rate of AdamW).` or
`unknown key 'rollout.samples_per_promt'; did you mean 'rollout.samples_per_prompt'?`.
Cross-field rules (`rules.py`) already speak this way and pass through unchanged.
"""

from __future__ import annotations

import difflib
from typing import get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from ascent.config.fields import (
    Loc,
    choice_members,
    dotted,
    field_at,
    iter_fields,
    section_at,
    without_tags,
)
from ascent.errors import AscentError

_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}
_PROBLEMS = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text (quote it in YAML when it looks like a number or a boolean)",
    "list_type": "must be a list, e.g. [a, b]",
    "tuple_type": "must be a list, e.g. [a, b]",
    "dict_type": "must be a mapping of key: value",
    "model_type": "must be a section: a mapping of its fields",
    "model_attributes_type": "must be a section: a mapping of its fields",
    "missing": "is required; set it",
}
_VALIDATOR_PREFIXES = ("Value error, ", "Assertion failed, ")
RULE_ERROR = "config_rule"  # a validator's problems, each line already naming its field, value and fix


class ConfigError(AscentError):
    """An invalid configuration. `problems` holds one message per problem; str() joins them by lines."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def rule_error(problems: list[str]) -> PydanticCustomError:
    """Raise this from a validator whose messages name their own fields; they reach the user unchanged."""
    return PydanticCustomError(RULE_ERROR, "{problems}", {"problems": "\n".join(problems)})


def from_validation_error(exc: ValidationError, schema: type[BaseModel]) -> ConfigError:
    """Turn every item of a pydantic ValidationError on `schema` into one readable problem."""
    problems: list[str] = []
    for err in exc.errors(include_url=False):
        for problem in _describe(err, schema):
            if problem not in problems:
                problems.append(problem)
    return ConfigError(problems)


def show_value(value: object, limit: int = 80) -> str:
    """A value as the user would write it: strings quoted, YAML spelling for null/bools/lists/dicts."""
    if isinstance(value, str):
        text = repr(value)
    elif value is None or isinstance(value, bool | list | tuple | dict):
        data = list(value) if isinstance(value, tuple) else value
        try:
            text = yaml.safe_dump(data, default_flow_style=True, width=10**6).strip()
            text = text.removesuffix("\n...").strip()
        except yaml.YAMLError:
            text = repr(value)
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(err: ErrorDetails, schema: type[BaseModel]) -> list[str]:
    loc: tuple[str | int, ...] = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return [unknown_key_message(loc, schema)]
    msg = str(err["msg"])
    if kind == RULE_ERROR:
        return [line for line in msg.splitlines() if line.strip()]
    for prefix in _VALIDATOR_PREFIXES:
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
            if not loc:  # a model-level rule: it already names its fields
                return [line for line in msg.splitlines() if line.strip()]
            return [f"{dotted(without_tags(schema, loc))}={show_value(err.get('input'))}: {msg}"]
    return [_field_problem(loc, err, schema)]


def _field_problem(loc: tuple[str | int, ...], err: ErrorDetails, schema: type[BaseModel]) -> str:
    path = dotted(without_tags(schema, loc)) or "the config"
    field = field_at(schema, loc)
    hint = f" ({field.description.rstrip('.')})" if field and field.description else ""
    problem = _problem_text(err)
    if err["type"] == "missing":
        problem = "is missing" if loc and isinstance(loc[-1], int) else problem
        return f"{path} {problem}{hint}."
    return f"{path}={show_value(err.get('input'))}: {problem}{hint}."


def _problem_text(err: ErrorDetails) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _BOUNDS:
        key, op = _BOUNDS[kind]
        bound = ctx.get(key)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op} {bound}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind in _PROBLEMS:
        return _PROBLEMS[kind]
    msg = str(err["msg"]).removeprefix("Input ").rstrip(".")
    return msg[:1].lower() + msg[1:]


def unknown_key_message(loc: Loc, schema: type[BaseModel]) -> str:
    """`unknown key 'a.b'; did you mean 'a.c'?`, or the list of valid keys when nothing is close."""
    path, key = dotted(without_tags(schema, loc)), str(loc[-1])
    parent_loc = loc[:-1]
    parent = section_at(schema, parent_loc)
    if parent is None:
        return f"unknown key {path!r}."
    prefix = dotted(without_tags(schema, parent_loc))
    names = list(parent.model_fields)
    close = difflib.get_close_matches(key, list(_candidates(parent)), n=1, cutoff=0.6)
    if close:
        return f"unknown key {path!r}; did you mean {_join(prefix, _candidates(parent)[close[0]])!r}?"
    elsewhere = _same_name_elsewhere(key, schema)
    if elsewhere:
        return f"unknown key {path!r}; did you mean {elsewhere!r}? ({_whose(schema, elsewhere, prefix)})"
    where = f"section '{prefix}'" if prefix else "the top level"
    return f"unknown key {path!r}; {where} has: {', '.join(names)}."


def _candidates(section: type[BaseModel]) -> dict[str, str]:
    """Names a misspelt key of `section` may have meant -> their path in it: its fields, and the settings of
    its choices (`gspo_clip_low` -> `policy_loss.gspo_clip_low`)."""
    out = {name: name for name in section.model_fields}
    for name, info in section.model_fields.items():
        for member in choice_members(info.annotation).values():
            out |= {f: f"{name}.{f}" for f in member.model_fields if f not in out}
    return out


def _same_name_elsewhere(key: str, schema: type[BaseModel]) -> str | None:
    # a choice's `name` is no setting one would misplace (`model.name` is not `algorithm.advantage.name`)
    paths = [f.path for f in iter_fields(schema) if not (f.name == "name" and _in_choice(schema, f.path))]
    exact = [p for p in paths if p.rsplit(".", 1)[-1] == key]
    if exact:
        return exact[0]
    leaves = {p.rsplit(".", 1)[-1]: p for p in reversed(paths)}
    close = difflib.get_close_matches(key, list(leaves), n=1, cutoff=0.8)
    return leaves[close[0]] if close else None


def _whose(schema: type[BaseModel], path: str, prefix: str) -> str:
    """Where `path` (a suggestion for a key under `prefix`) lives: another member of the same choice
    (`a setting of policy_loss=gspo`), or another section."""
    parent, leaf = path.rsplit(".", 1)
    field = field_at(schema, parent.split("."))
    if parent != prefix or field is None:
        return "it belongs to another section"
    names = [
        str(name)
        for member in choice_members(field.info.annotation).values()
        if leaf in member.model_fields
        for name in get_args(member.model_fields["name"].annotation)
    ]
    choice = parent.rsplit(".", 1)[-1]
    if not names:
        return "it belongs to another section"
    who = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"a setting of {choice}={who}"


def _in_choice(schema: type[BaseModel], path: str) -> bool:
    """True when dotted `path` is a field of a choice's member (`algorithm.policy_loss.name`)."""
    parent = field_at(schema, path.split(".")[:-1])
    return parent is not None and bool(choice_members(parent.info.annotation))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
