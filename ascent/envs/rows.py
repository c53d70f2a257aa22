"""What environments read from a dataset row, in ascent's shape or in SkyRL-gym's, so both load as they are.

ascent's rows are flat: `{"prompt": "...", "answer": 42, "env": "python_math", "db_path": ...}`. SkyRL-gym's
rows nest: `{"prompt": [{"role": "user", "content": ...}], "env_class": "name", "reward_spec": {"method":
"rule", "ground_truth": ...}, "extra_info": {...}}`. The helpers read either: `row_env` (`env`, else
`env_class`), `row_answer` (`answer`, else `reward_spec.ground_truth`), `row_field` (a column, else the same
key in `extra_info`) and `row_messages` (a string prompt as one user message, a message list as it is).
`UnusableRowError` is how an environment says a row's own file (an image, a video) is missing or unreadable:
the run leaves that row out, naming it, and goes on (`unusable_row` reads it back from a failed reset).
Only `ascent.errors` is imported from ascent (design: envs import only messages and errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING: Any = object()


class RowFieldError(KeyError):
    """A row lacks a column an environment needs (a KeyError, so callers that catch one still do)."""

    def __str__(self) -> str:  # KeyError quotes its argument; this one is a sentence
        return str(self.args[0])


class UnusableRowError(ValueError):
    """A file the row names (its image, frames or video) is missing or unreadable: a problem of this row's
    data, not of the environment, so the run leaves the row out (warned, with the message, and counted in
    the data report) and goes on. Any other failed reset stops the run. Raise this class itself: a failure
    reaches the controller as its text, "UnusableRowError: <message>", which `unusable_row` reads."""


def unusable_row(failure: object) -> str | None:
    """The message of a reset that failed with `UnusableRowError` (`failure`: its error text, as hosts report
    it), else None (a reset that worked, or failed otherwise)."""
    head = f"{UnusableRowError.__name__}: "
    return failure[len(head) :] if isinstance(failure, str) and failure.startswith(head) else None


def row_env(row: Mapping[str, Any]) -> str | None:
    """The environment a row names: its `env` column, else SkyRL's `env_class`; None when it names none."""
    name = row.get("env") or row.get("env_class")
    return str(name) if name else None


def row_answer(row: Mapping[str, Any]) -> Any:
    """The row's reference answer: `answer`, else `reward_spec.ground_truth` (SkyRL's shape)."""
    if "answer" in row:
        return row["answer"]
    spec = row.get("reward_spec")
    if isinstance(spec, Mapping) and "ground_truth" in spec:
        return spec["ground_truth"]
    raise RowFieldError(
        f"the row has no answer: give it an `answer` column or `reward_spec.ground_truth` (its fields: "
        f"{sorted(row)})"
    )


def row_has(row: Mapping[str, Any], key: str) -> bool:
    """Whether `row_field(row, key)` finds a value other than None (in the row or its extra_info)."""
    return row_field(row, key, None) is not None


def row_field(row: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
    """`row[key]`, else `row["extra_info"][key]` (where SkyRL's rows keep per-row arguments), else
    `default`."""
    if key in row:
        return row[key]
    extra = row.get("extra_info")
    if isinstance(extra, Mapping) and key in extra:
        return extra[key]
    if default is _MISSING:
        raise RowFieldError(f"the row has no {key!r} (nor extra_info.{key}); its fields: {sorted(row)}")
    return default


def row_messages(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """The row's `prompt` as chat messages: a string is one user message, a list of messages is kept."""
    prompt = row_field(row, "prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, Mapping) for m in prompt):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    raise TypeError(f"prompt must be a string or a list of chat messages, not {type(prompt).__name__}")
