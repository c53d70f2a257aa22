"""Walk the config schema by dotted path: which model owns a key, its description, its type.

Shared by the loader (type-aware override parsing), the error formatter (descriptions, "did you mean")
and `ascent config show --explain`. Works on the pydantic classes alone; never builds a config.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

Loc = Sequence[str | int]


@dataclass(frozen=True)
class FieldRef:
    """One field of the schema: its dotted path, the class that declares it and its pydantic info."""

    path: str
    owner: type[BaseModel]
    name: str
    info: FieldInfo

    @property
    def description(self) -> str:
        return self.info.description or ""


def is_section(annotation: Any) -> TypeGuard[type[BaseModel]]:
    """True when `annotation` is a nested config section (a pydantic model class)."""
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def is_text(annotation: Any) -> bool:
    """True for `str`, string `Literal`s and their `| None` forms: fields whose values are always text."""
    if annotation is str:
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return all(isinstance(a, str) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return len(args) == 1 and is_text(args[0])
    return False


def dotted(loc: Loc) -> str:
    """('rollout', 'stop_token_ids', 0) -> 'rollout.stop_token_ids[0]'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def section_at(schema: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The section class reached by following `loc` from `schema` (None if `loc` leaves the sections)."""
    model = schema
    for part in loc:
        if not isinstance(part, str) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        if not is_section(annotation):
            return None
        model = annotation
    return model


def field_at(schema: type[BaseModel], loc: Loc) -> FieldRef | None:
    """The schema field named by the longest prefix of `loc` that is a field (None if the first part is not)."""
    model: type[BaseModel] = schema
    found: FieldRef | None = None
    names: list[str] = []
    for part in loc:
        if not isinstance(part, str) or part not in model.model_fields:
            break
        names.append(part)
        info = model.model_fields[part]
        found = FieldRef(".".join(names), model, part, info)
        if not is_section(info.annotation):
            break
        model = info.annotation
    return found


def iter_fields(schema: type[BaseModel], prefix: str = "") -> Iterator[FieldRef]:
    """Every leaf field of `schema` in declaration order, nested sections flattened to dotted paths."""
    for name, info in schema.model_fields.items():
        path = f"{prefix}{name}"
        if is_section(info.annotation):
            yield from iter_fields(info.annotation, prefix=f"{path}.")
        else:
            yield FieldRef(path, schema, name, info)


def value_at(data: Any, path: str) -> Any:
    """The value at dotted `path` of a nested dict (KeyError when absent)."""
    for part in path.split("."):
        data = data[part]
    return data
