"""Every config field has a consumer: something outside ascent/config reads it.

A static walk: for each field of every section of the `ascent train` and `ascent sft` schemas, the package
(outside ascent/config, where only the schema and its validation live) must read it as an attribute
(`cfg.train.lr`, `t.lr`), take it as a keyword parameter of the same name (sections dumped into keyword
arguments, e.g. the policy-loss options), or index it by its name as a string. A field added to the schema
and wired nowhere fails here with its dotted name.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pydantic import BaseModel

from ascent.config.fields import sub_models
from ascent.config.schema import RunConfig, SFTConfig

PACKAGE = Path(__file__).resolve().parents[3] / "ascent"


def _uses() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, (ast.arg, ast.keyword)) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)
    return names


def _fields(schema: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """(dotted path, field name) of every leaf field, nested sections and every member of a choice walked."""
    out = []
    for name, info in schema.model_fields.items():
        subs = sub_models(info.annotation)
        for sub in subs:
            out += _fields(sub, f"{prefix}{name}.")
        if not subs:
            out.append((f"{prefix}{name}", name))
    return out


def test_every_field_is_read_somewhere():
    used = _uses()
    unread = sorted(
        {path for schema in (RunConfig, SFTConfig) for path, name in _fields(schema) if name not in used}
    )
    assert not unread, f"config fields nothing outside ascent/config reads: {unread}"


def test_the_walk_enters_every_member_of_a_choice():
    paths = {path for path, _ in _fields(RunConfig)}
    assert {
        "algorithm.policy_loss.gspo_clip_low",
        "algorithm.advantage.lam",
        "algorithm.policy_loss.name",
    } <= paths


def test_the_walk_would_catch_a_new_field():
    class Probe(BaseModel):
        surely_nothing_reads_this_field: int = 0

    assert [n for _, n in _fields(Probe) if n not in _uses()] == ["surely_nothing_reads_this_field"]
