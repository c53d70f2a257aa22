"""The result of one doctor check, and how `ascent doctor` prints them (a rich table, or JSON) and exits.

A check has a status: `ok`, `warn` (the run may work, or work badly), `fail` (the run will not work) or
`skipped` (not relevant to this config, or not checkable here; the detail says why). warn and fail carry
the fix in one sentence. The exit status is 1 when any check failed, else 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

Status = Literal["ok", "warn", "fail", "skipped"]
STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "skipped": "dim"}


@dataclass(frozen=True)
class CheckResult:
    """One check: its name, status, what was found, the fix (warn / fail) and machine-readable facts."""

    name: str
    status: Status
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def ok(name: str, detail: str, **data: Any) -> CheckResult:
    return CheckResult(name, "ok", detail, data=data)


def warn(name: str, detail: str, fix: str, **data: Any) -> CheckResult:
    return CheckResult(name, "warn", detail, fix, data)


def fail(name: str, detail: str, fix: str, **data: Any) -> CheckResult:
    return CheckResult(name, "fail", detail, fix, data)


def skipped(name: str, reason: str, **data: Any) -> CheckResult:
    return CheckResult(name, "skipped", reason, data=data)


def exit_code(results: Sequence[CheckResult]) -> int:
    return 1 if any(r.status == "fail" for r in results) else 0


def to_json(results: Sequence[CheckResult]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in STYLES}
    return json.dumps({"checks": [asdict(r) for r in results], "counts": counts}, indent=1, default=str)


def print_table(results: Sequence[CheckResult], extra: Sequence[Any] = ()) -> None:
    """One row per check (status coloured), then any extra renderables (the memory table)."""

    console = Console(highlight=False)
    table = Table(title="ascent doctor", title_justify="left", title_style="bold", expand=False)
    table.add_column("check", overflow="fold")
    table.add_column("status")
    table.add_column("found", overflow="fold", ratio=2)
    table.add_column("fix", overflow="fold", ratio=2)
    for r in results:
        table.add_row(Text(r.name), Text(r.status, style=STYLES[r.status]), Text(r.detail), Text(r.fix))
    console.print(table)
    for item in extra:
        console.print(item)
    counts = ", ".join(f"{sum(r.status == s for r in results)} {s}" for s in STYLES)
    console.print(Text(counts, style="bold red" if exit_code(results) else "bold"))
