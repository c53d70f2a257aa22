"""What each config field means: rows of (section, field, value, default, description).

Feeds `ascent config show --explain`. Plain data only; the CLI renders it (rich tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ascent.config.fields import iter_fields, value_at
from ascent.config.loader import to_plain

TOP_LEVEL = "run"


@dataclass(frozen=True)
class FieldRow:
    """One leaf field: `section` is its top-level section (`run` for top-level fields)."""

    section: str
    name: str
    value: Any
    default: Any
    description: str

    @property
    def changed(self) -> bool:
        return self.value != self.default


def explain_rows(cfg: BaseModel) -> list[FieldRow]:
    """One row per leaf field of `cfg`, in schema order, with the schema's default next to the value. A choice
    (`algorithm.policy_loss`) shows the fields of the member `cfg` holds, each with that member's default."""
    schema = type(cfg)
    values, defaults = to_plain(cfg), _defaults(schema)
    rows = []
    for ref in iter_fields(schema, cfg=cfg):
        section, _, name = ref.path.partition(".")
        if not name:
            section, name = TOP_LEVEL, ref.path
        default = _lookup(defaults, ref.path, ref.info)
        rows.append(FieldRow(section, name, value_at(values, ref.path), default, ref.description))
    return rows


def explain_sections(cfg: BaseModel) -> dict[str, list[FieldRow]]:
    """`explain_rows` grouped by section (top-level fields first, under `run`)."""
    out: dict[str, list[FieldRow]] = {}
    for row in explain_rows(cfg):
        out.setdefault(row.section, []).append(row)
    return out


def _defaults(schema: type[BaseModel]) -> dict[str, Any]:
    try:
        return to_plain(schema())
    except ValidationError:  # a schema whose defaults break its own rules: fall back per field
        return {}


def _lookup(defaults: dict[str, Any], path: str, info: Any) -> Any:
    try:
        return value_at(defaults, path)
    except (KeyError, TypeError):  # also a field of a member other than the default choice's
        return to_plain_value(info.get_default(call_default_factory=True))


def to_plain_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
