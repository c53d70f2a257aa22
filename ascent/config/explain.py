"""What each config field means: rows of (section, field, value, default, description).

Feeds `ascent config show --explain [FIELD ...]`: `matching_rows` picks the fields whose dotted path contains
FIELD, and `plain_lines` writes one field per line for pipes (`| grep`); on a terminal the CLI renders the
rows as rich tables.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ascent.config.errors import ConfigError, show_value
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

    @property
    def path(self) -> str:
        """The dotted key an override uses (`train.lr`; top-level fields bare: `seed`)."""
        return self.name if self.section == TOP_LEVEL else f"{self.section}.{self.name}"


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


def matching_rows(rows: list[FieldRow], terms: list[str]) -> list[FieldRow]:
    """The rows whose dotted path contains any of `terms` (case-insensitive); all rows without terms. A term
    that matches nothing is a ConfigError naming the closest fields."""
    if not terms:
        return rows
    out = []
    for term in terms:
        found = [r for r in rows if term.lower() in r.path.lower()]
        if not found:
            leaves = {r.path.rsplit(".", 1)[-1]: r.path for r in rows}
            close = difflib.get_close_matches(term, list(leaves), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(leaves[c] for c in close)}?" if close else "."
            raise ConfigError(f"--explain {term}: no config field has {term!r} in its name{hint}")
        out += [r for r in found if r not in out]
    return out


def plain_lines(rows: list[FieldRow]) -> list[str]:
    """One line per field, never wrapped: `path=value  (default: d)  description`; `*` marks a changed
    value."""
    return [
        f"{r.path}={show_value(r.value, limit=200)}{' *' if r.changed else ''}  "
        f"(default: {show_value(r.default, limit=200)})  {r.description}"
        for r in rows
    ]


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
