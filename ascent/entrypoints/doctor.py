"""`ascent doctor [CONFIG] [key=value ...]`: check the machine, cluster, disk, trackers and model before a
long run, and estimate the memory per GPU (or the RAM of a CPU run) (`ascent.doctor`). Prints a table (or
`--json`); exits 0 when nothing failed, 1 when a check failed, 2 for a bad config or option. `ascent.cli`
registers `doctor_command`.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.table import Table

from ascent.config import RunConfig
from ascent.entrypoints.guard import ErrorGuard, load_for_command
from ascent.errors import AscentError


def doctor_command(
    config: Annotated[
        str | None,
        typer.Argument(help="Run config YAML (omitted: defaults + overrides).", show_default=False),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted key=value overrides.", show_default=False)
    ] = None,
    gpu_memory: Annotated[
        float | None,
        typer.Option(
            "--gpu-memory",
            help="Check the memory estimate against a GPU of this many GiB.",
            show_default=False,
        ),
    ] = None,
    port: Annotated[
        list[int] | None, typer.Option("--port", help="A port the run or its server will bind (repeatable).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable results.")] = False,
) -> None:
    """Check everything a long run needs, and estimate its memory per GPU.

    Example: ascent doctor run.yaml --gpu-memory 80
    """

    with ErrorGuard():
        if gpu_memory is not None and gpu_memory <= 0:
            raise AscentError(
                f"--gpu-memory {gpu_memory:g}: give the GPU's memory in GiB, e.g. --gpu-memory 80."
            )
        bad = [p for p in port or [] if not 0 < p < 65536]
        if bad:
            raise AscentError(f"--port {bad[0]}: not a TCP port; use 1-65535.")
        cfg = load_for_command(config, overrides, RunConfig)
        os.environ.setdefault(
            "HF_HUB_OFFLINE", "1"
        )  # before transformers loads: the doctor never asks the hub
        from ascent.doctor import report as R  # deferred: `ascent.cli` imports this module at start
        from ascent.doctor.run import run_checks  # deferred: `ascent.cli` imports this module at start

        result = run_checks(cfg, gpu_memory_gib=gpu_memory, ports=list(port or []))
        if as_json:
            typer.echo(R.to_json(result.results))
        else:
            R.print_table(result.results, [memory_table(result)] if result.estimate else [])
    raise typer.Exit(R.exit_code(result.results))


def memory_table(result: Any) -> Any:
    """Terms (rows) by phase (columns), GiB."""

    from ascent.doctor.memory import GIB  # deferred: `ascent.cli` imports this module at start

    est = result.estimate
    phases = list(est.phases)
    where = "per GPU" if result.inputs and result.inputs.gpu_bytes else "per trainer process"
    table = Table(title=f"memory estimate {where} (GiB allocated)", title_justify="left", title_style="bold")
    table.add_column("term")
    for p in phases:
        table.add_column(p, justify="right")
    terms = list(dict.fromkeys(t for p in phases for t in est.phases[p]))
    for t in terms:
        values = [est.phases[p].get(t) for p in phases]
        if any(values):
            table.add_row(t, *("" if v is None else f"{v / GIB:.2f}" for v in values))
    table.add_row("total", *(f"{est.total(p) / GIB:.2f}" for p in phases), style="bold")
    return table
