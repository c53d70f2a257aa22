"""The studio's config views: a run's resolved config explained, and the editor's validate and save.

Everything goes through the real config package, so the studio says what the CLI says: the run's
`config.yaml` is loaded with `load_config` and explained with `explain_sections` (as `ascent config show
--explain`); the editor's text is parsed with `parse_yaml` and validated with `validate_config`, and its
problems are the `ConfigError` lines `ascent train` prints, each naming the field and the fix. `kind` picks
the schema: "train" (RunConfig) or "sft" (SFTConfig).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ascent.config import ConfigError, RunConfig, SFTConfig, load_config, parse_yaml, validate_config
from ascent.config.errors import show_value
from ascent.config.explain import explain_sections
from ascent.config.fields import sub_models
from ascent.config.loader import CONFIG_FILE
from ascent.errors import AscentError

SCHEMAS: dict[str, type[BaseModel]] = {"train": RunConfig, "sft": SFTConfig}
EDITOR_SOURCE = "editor"
# the dotted field a ConfigError line starts with (`train.lr=-1: ...`, `unknown key 'rollout.x'; ...`)
_FIELD_AT_START = re.compile(r"^(?:unknown key ')?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


class SaveError(AscentError):
    """The editor's save target is outside RUNS_DIR, not a YAML file, already exists, or cannot be written."""


def schema_for(kind: str) -> type[BaseModel]:
    if kind not in SCHEMAS:
        raise AscentError(f"kind {kind!r}: unknown; use one of {', '.join(SCHEMAS)}.")
    return SCHEMAS[kind]


def run_config(run_dir: Path, kind: str | None = None) -> dict[str, Any]:
    """{kind, yaml, sections, problems} for `<run_dir>/config.yaml`: `sections` maps each section to rows
    of (name, value, default, description, changed). The kind tried first is `kind`, then train, then sft."""
    path = run_dir / CONFIG_FILE
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    kinds = [k for k in (kind, "train", "sft") if k in SCHEMAS]
    problems: list[str] = []
    for candidate in dict.fromkeys(kinds):
        try:
            cfg = load_config(path, [], SCHEMAS[candidate])
        except ConfigError as err:
            problems = problems or err.problems
            continue
        return {"kind": candidate, "yaml": text, "sections": explain(cfg), "problems": []}
    return {"kind": kinds[0], "yaml": text, "sections": {}, "problems": problems}


def explain(cfg: BaseModel) -> dict[str, list[dict[str, Any]]]:
    """`explain_sections` as JSON-ready rows; values spelled as the CLI shows them (YAML style)."""
    return {
        section: [
            {
                "name": r.name,
                "value": show_value(r.value, limit=200),
                "default": show_value(r.default),
                "description": r.description,
                "changed": r.changed,
            }
            for r in rows
        ]
        for section, rows in explain_sections(cfg).items()
    }


def field_descriptions(kind: str) -> dict[str, str]:
    """Every dotted field and section of the schema -> its description (the editor's hints)."""
    out: dict[str, str] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            path = f"{prefix}{name}"
            out[path] = info.description or ""
            for sub in sub_models(info.annotation):  # a section, or every member of a choice
                walk(sub, f"{path}.")

    walk(schema_for(kind), "")
    return out


def validate_text(text: str, kind: str, source: str = EDITOR_SOURCE) -> dict[str, Any]:
    """{ok, problems, fields}: the text checked exactly as `ascent train FILE` checks a file; `fields` are
    the dotted fields the problems name (for highlighting)."""
    schema = schema_for(kind)
    try:
        validate_config(parse_yaml(text, source), schema)
    except ConfigError as err:
        fields = []
        for problem in err.problems:
            m = _FIELD_AT_START.match(problem)
            if m and ("." in m.group(1) or m.group(1) in schema.model_fields):
                fields.append(m.group(1))
        return {"ok": False, "problems": err.problems, "fields": list(dict.fromkeys(fields))}
    return {"ok": True, "problems": [], "fields": []}


def save_text(root: Path, target: str, text: str, kind: str, overwrite: bool = False) -> Path:
    """Write the editor's text to `target` (relative to RUNS_DIR, .yaml/.yml) once it validates; returns the
    path. ConfigError when the text is invalid; SaveError for a bad target."""
    path = (root / target).resolve()
    if root.resolve() not in path.parents:
        raise SaveError(
            f"save path {target!r} is outside the runs directory {root}; choose a path inside it."
        )
    if path.suffix not in (".yaml", ".yml"):
        raise SaveError(f"save path {target!r}: name a .yaml file, e.g. configs/run.yaml.")
    if path.exists() and not overwrite:
        raise SaveError(
            f"save path {target!r} already exists; confirm to overwrite it, or choose another name."
        )
    check = validate_text(text, kind, source=target)
    if not check["ok"]:
        raise ConfigError(check["problems"])
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:  # a folder of that name, a file where a folder must be, no permission
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise SaveError(
            f"save path {target!r}: cannot write there ({err.strerror or err}); choose another name."
        ) from err
    return path
