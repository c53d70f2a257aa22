"""`ascent config show [CONFIG] [key=value ...] [--explain [FIELD ...]] [--sft]`: the resolved config as YAML,
or what its fields mean (`ascent.config.explain`): on a terminal one table per section, piped one field per
line (`path=value  (default: d)  description`) so that `grep` finds a field by name. Words after --explain
that are neither key=value nor a file pick the fields whose dotted name contains them. `ascent.cli` registers
`config_show_command`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ascent.config.errors import show_value
from ascent.config.explain import FieldRow, explain_rows, matching_rows, plain_lines


def config_show_command(
    config: Annotated[
        str | None, typer.Argument(help="Config YAML file; omitted: defaults only.", show_default=False)
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="Dotted key=value overrides (and, with --explain, field names to look up).",
            show_default=False,
        ),
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Each field with its value, default and description; words that are not key=value pick the "
            "fields whose name contains them (--explain micro_batch). Piped: one field per line.",
        ),
    ] = False,
    sft_config: Annotated[bool, typer.Option("--sft", help="Read it as an `ascent sft` config.")] = False,
) -> None:
    """Print the resolved config (file + overrides + defaults) as YAML, or explain its fields.

    Example: ascent config show run.yaml --explain max_tokens_per_micro_batch
    """
    from ascent.cli import ErrorGuard, load_for_command, sft_hint  # here: ascent.cli imports this module
    from ascent.config import ConfigError, RunConfig, SFTConfig, dump_config

    with ErrorGuard():
        schema = SFTConfig if sft_config else RunConfig
        terms: list[str] = []
        if explain:
            config, overrides, terms = explain_terms(config, overrides)
        try:
            cfg = load_for_command(config, overrides, schema)
        except ConfigError as err:
            raise (err if sft_config else sft_hint(config, overrides, err)) from None
        if not explain:
            typer.echo(dump_config(cfg), nl=False)
            return
        rows = matching_rows(explain_rows(cfg), terms)
        if sys.stdout.isatty():
            print_explain(rows)
        else:  # piped: plain lines that grep and cut can read
            typer.echo("\n".join(plain_lines(rows)))


def explain_terms(config: str | None, overrides: list[str] | None) -> tuple[str | None, list[str], list[str]]:
    """(config file, overrides, field search terms) of `config show --explain ...`: a word that is neither
    key=value nor an existing file (nor named *.yaml) is a term."""
    words = [w for w in [config, *(overrides or [])] if w is not None]
    is_term = [("=" not in w and not Path(w).exists() and not w.endswith((".yaml", ".yml"))) for w in words]
    rest = [w for w, term in zip(words, is_term, strict=True) if not term]
    has_file = bool(rest) and "=" not in rest[0]
    terms = [w for w, term in zip(words, is_term, strict=True) if term]
    return (rest[0] if has_file else None), rest[1 if has_file else 0 :], terms


def print_explain(rows: list[FieldRow]) -> None:
    """One table per section: field (never wrapped), value (bold when it differs from the default), default,
    description."""
    console = Console(highlight=False)
    sections: dict[str, list[FieldRow]] = {}
    for row in rows:
        sections.setdefault(row.section, []).append(row)
    for section, section_rows in sections.items():
        table = Table(title=section, title_justify="left", title_style="bold", expand=False)
        table.add_column("field", no_wrap=True)
        table.add_column("value", overflow="fold", max_width=32)
        table.add_column("default", overflow="fold", max_width=32)
        table.add_column("description", overflow="fold", ratio=1)
        for row in section_rows:
            value = Text(show_value(row.value), style="bold yellow" if row.changed else "")
            table.add_row(Text(row.name), value, Text(show_value(row.default)), Text(row.description))
        console.print(table)
