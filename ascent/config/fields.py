"""Walk the config schema by dotted path: which model owns a key, its description, its type.

Shared by the loader (type-aware override parsing), the error formatter (descriptions, "did you mean")
and `ascent config show --explain`. Works on the pydantic classes alone; never builds a config. A choice
(`algorithm.policy_loss`, a union of models switched on `name`, see `choices.py`) is walked into its
members; pydantic's error locations name the member's tag after the field (`without_tags` drops it).
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeGuard, Union, get_args, get_origin

from pydantic import BaseModel, Tag
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


def choice_members(annotation: Any) -> dict[str, type[BaseModel]]:
    """A choice's members by tag: `Union[Annotated[Model, Tag(t)], ...]` -> {t: Model}; {} for other
    fields."""
    if get_origin(annotation) not in (Union, types.UnionType):
        return {}
    out: dict[str, type[BaseModel]] = {}
    for arg in get_args(annotation):
        if get_origin(arg) is not Annotated:
            return {}
        model, *meta = get_args(arg)
        tags = [m.tag for m in meta if isinstance(m, Tag)]
        if not tags or not is_section(model):
            return {}
        out[tags[0]] = model
    return out


def sub_models(annotation: object) -> list[type[BaseModel]]:
    """The models a field holds: [the section] for a section, every member of a choice, [] for a value."""
    if is_section(annotation):
        return [annotation]
    return list(dict.fromkeys(choice_members(annotation).values()))


def list_element(annotation: Any) -> Any:
    """The element type of a list of sections or choices (`reward.group_hooks`); None for other fields."""
    if get_origin(annotation) is list and len(get_args(annotation)) == 1:
        element = get_args(annotation)[0]
        if get_origin(element) is Annotated:  # a choice's union with its discriminator
            element = get_args(element)[0]
        return element if sub_models(element) else None
    return None


def _step(model: type[BaseModel], loc: Loc, i: int) -> tuple[type[BaseModel] | None, int]:
    """From field loc[i] of `model`: the model it leads into and the index after it (past a list's index and
    a choice's tag). For a choice without a tag next, the first member that has the field named next."""
    annotation = model.model_fields[str(loc[i])].annotation
    element = list_element(annotation)
    if element is not None and i + 1 < len(loc) and isinstance(loc[i + 1], int):
        annotation, i = element, i + 1
    if is_section(annotation):
        return annotation, i + 1
    members = choice_members(annotation)
    nxt = loc[i + 1] if i + 1 < len(loc) else None
    if isinstance(nxt, str) and nxt in members:
        return members[nxt], i + 2
    having = [m for m in members.values() if nxt in m.model_fields]
    return (having[0] if having else None), i + 1


def section_at(schema: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The section (or choice member) reached by following `loc` from `schema` (None if `loc` leaves them)."""
    model: type[BaseModel] | None = schema
    i = 0
    while i < len(loc):
        part = loc[i]
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model, i = _step(model, loc, i)
    return model


def field_at(schema: type[BaseModel], loc: Loc) -> FieldRef | None:
    """The schema field named by the longest prefix of `loc` that is a field (None if the first part is
    not)."""
    model: type[BaseModel] | None = schema
    found: FieldRef | None = None
    names: list[str] = []
    i = 0
    while i < len(loc) and model is not None:
        part = loc[i]
        if not isinstance(part, str) or part not in model.model_fields:
            break
        names.append(part)
        found = FieldRef(".".join(names), model, part, model.model_fields[part])
        walks = sub_models(found.info.annotation) or list_element(found.info.annotation) is not None
        model, i = _step(model, loc, i) if walks else (None, i)
    return found


def without_tags(schema: type[BaseModel], loc: Loc) -> tuple[str | int, ...]:
    """An error location as the user wrote it: ('algorithm', 'policy_loss', 'GspoLoss', 'x') drops
    'GspoLoss' (a list's index stays: ('reward', 'group_hooks', 0, 'CuriosityHook', 'alpha'))."""
    out: list[str | int] = []
    model: type[BaseModel] | None = schema
    i = 0
    while i < len(loc):
        part = loc[i]
        out.append(part)
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            model, i = None, i + 1
        else:
            start = i
            model, i = _step(model, loc, i)
            out += [p for p in loc[start + 1 : i] if isinstance(p, int)]
    return tuple(out)


def iter_fields(
    schema: type[BaseModel], prefix: str = "", cfg: BaseModel | None = None
) -> Iterator[FieldRef]:
    """Every leaf field of `schema` in declaration order, nested sections flattened to dotted paths.

    A choice lists the fields of all its members (each path once), or with `cfg` (a config of `schema`)
    those of the member `cfg` holds."""
    seen: set[str] = set()
    for name, info in schema.model_fields.items():
        path = f"{prefix}{name}"
        value = getattr(cfg, name) if cfg is not None else None
        models = [type(value)] if isinstance(value, BaseModel) else sub_models(info.annotation)
        if not models:
            yield FieldRef(path, schema, name, info)
        for model in models:
            for ref in iter_fields(model, f"{path}.", value if isinstance(value, BaseModel) else None):
                if ref.path not in seen:
                    seen.add(ref.path)
                    yield ref


def value_at(data: Any, path: str) -> Any:
    """The value at dotted `path` of a nested dict (KeyError when absent)."""
    for part in path.split("."):
        data = data[part]
    return data
