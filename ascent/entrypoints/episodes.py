"""`ascent episodes RUN_DIR`: list, show and export the episodes of a run's experience store.

The store is `<run_dir>/experience.db` (`ascent.tracking.experience_store`); this reads it read-only, so it works
while the run writes. Without `--show` or `--export` it prints a table of the episodes that pass the filters;
`--show ID` prints one episode turn by turn (`--tokens` adds every response token with its loss mask,
sampler logprob and policy version); `--export out.jsonl|out.parquet` writes the filtered episodes.
`ascent.cli` registers `episodes_command` as the command.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ascent.entrypoints.guard import ErrorGuard
from ascent.tracking.experience_store import (
    STATUSES,
    EpisodeRecord,
    ExperienceStore,
    StoreError,
    export,
    labelled_segments,
    open_store,
)

DEFAULT_LIMIT = 50


def episodes_command(
    run_dir: Annotated[str, typer.Argument(help="Run directory (or its experience.db).", show_default=False)],
    iteration: Annotated[int | None, typer.Option(help="Only this iteration.", show_default=False)] = None,
    min_reward: Annotated[
        float | None, typer.Option(help="Only rewards >= this.", show_default=False)
    ] = None,
    max_reward: Annotated[
        float | None, typer.Option(help="Only rewards <= this.", show_default=False)
    ] = None,
    env: Annotated[str | None, typer.Option(help="Only this environment.", show_default=False)] = None,
    status: Annotated[
        str | None,
        typer.Option(
            help=f"Only this status: {', '.join(STATUSES)}, or dropped (any but trained).", show_default=False
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help=f"At most N episodes (listing: {DEFAULT_LIMIT}; export: all).")
    ] = None,
    show: Annotated[
        int | None, typer.Option(help="Print this episode turn by turn.", show_default=False)
    ] = None,
    tokens: Annotated[
        bool, typer.Option("--tokens", help="With --show: every token, mask and logprob.")
    ] = False,
    out: Annotated[
        str | None, typer.Option("--export", help="Write the episodes to a .jsonl or .parquet file.")
    ] = None,
) -> None:
    """List, show or export the episodes of a run (its experience.db).

    Example: ascent episodes runs/grpo --iteration 3 --status dropped; ascent episodes runs/grpo --show 12
    """

    with ErrorGuard():
        if show is not None and out is not None:
            raise StoreError("--show and --export: choose one (--export writes the filtered episodes).")
        filters = {
            "iteration": iteration,
            "min_reward": min_reward,
            "max_reward": max_reward,
            "env": env,
            "status": status,
        }
        with open_store(run_dir) as store:
            if show is not None:
                print_episode(store, store.episode(show), tokens)
            elif out is not None:
                n = export(store.iter_episodes(limit, **filters), out)
                typer.echo(f"{n} episodes written to {out}")
            else:
                print_table(store, limit or DEFAULT_LIMIT, filters)


def print_table(store: ExperienceStore, limit: int, filters: dict[str, Any]) -> None:
    """One line per episode: where it came from, what became of it, its reward and the start of its text.
    Columns that say nothing here (one env, single turns, no staleness) are left out, so it fits 80
    columns."""
    records = store.episodes(limit, **filters)
    if not records:
        typer.echo(f"{store.path}: no episodes match ({store.count()} in all).")
        return
    total = store.count(**filters)
    columns: dict[str, Any] = {
        "id": lambda r: str(r.id),
        "it": lambda r: str(r.iteration),
        "grp": lambda r: _opt(r.group_index),
        "row": lambda r: str(r.row_id),
        "env": lambda r: r.env or "-",
        "status": lambda r: r.status,
        "reward": lambda r: f"{r.reward:.3g}",
        "adv": lambda r: _opt(r.advantage),
        "turns": lambda r: str(r.turns),
        "finish": lambda r: r.finish_reason,
        "tok": lambda r: str(r.response_len),
        "stale": lambda r: str(r.staleness),
        "response": lambda r: r.response_text.replace("\n", "⏎"),
    }
    envs = {r.env for r in records}
    for name, says_nothing in (
        ("env", len(envs) <= 1),
        ("turns", all(r.turns == 1 for r in records)),
        ("stale", all(r.staleness == 0 for r in records)),
    ):
        if says_nothing:
            del columns[name]
    title = str(store.path) + (f" (env {next(iter(envs))})" if len(envs) == 1 and None not in envs else "")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, expand=False)
    widest = {"response": 8, "status": max((len(r.status) for r in records), default=6)}
    for name in columns:
        table.add_column(name, no_wrap=True, overflow="ellipsis", min_width=widest.get(name, len(name)))
    for r in records:
        table.add_row(*(Text(cell(r)) for cell in columns.values()))
    console = Console(highlight=False)
    console.print(table)
    more = f"; --limit {total} shows all" if total > len(records) else ""
    console.print(Text(f"{len(records)} of {total} episodes{more}. --show ID prints one turn by turn."))


def print_episode(store: ExperienceStore, r: EpisodeRecord, tokens: bool) -> None:
    """The episode turn by turn: prompt, then each model turn and observation, with loss mask and rewards."""
    console = Console(highlight=False, soft_wrap=True)
    decode = _token_decoder(store, console) if tokens else None
    for line in _header(r):
        console.print(Text(line, style="bold"))
    console.print(Text(f"prompt ({r.prompt_len} tokens, loss mask 0)", style="cyan"))
    console.print(Text(r.prompt_text or str(r.prompt_ids)))
    for label, seg in labelled_segments(r):
        console.print(
            Text(
                f"{label} ({seg['end'] - seg['start']} tokens, loss mask {seg['mask']})",
                style="green" if seg["mask"] else "yellow",
            )
        )
        console.print(Text(seg["text"] or str(r.response_ids[seg["start"] : seg["end"]])))
        if decode is not None:
            console.print(_token_table(r, seg["start"], seg["end"], decode))
    if "env_error" in r.metadata:
        console.print(Text(f"environment error: {r.metadata['env_error']}", style="red"))


def _header(r: EpisodeRecord) -> list[str]:
    where = f"episode {r.id}: iteration {r.iteration}, group {_opt(r.group_index)}, row {r.row_id}"
    parts = ", ".join(f"{k} {v:.3g}" for k, v in r.reward_components.items())
    fate = r.status + (f" ({r.drop_reason})" if r.drop_reason else "")
    low, high = (
        min(r.token_versions, default=r.policy_version),
        max(r.token_versions, default=r.policy_version),
    )
    return [
        where + (f", env {r.env}" if r.env else ""),
        f"{fate}; reward {r.reward:.4g}"
        + (f" ({parts})" if parts else "")
        + f", advantage {_opt(r.advantage)}",
        f"finish {r.finish_reason}, {r.turns} turn(s), {r.response_len} response tokens "
        f"({sum(r.loss_mask)} with loss mask 1), token versions {low}..{high}, trainer {r.trainer_version}, "
        f"staleness {r.staleness}",
    ]


def _token_table(r: EpisodeRecord, start: int, end: int, decode: Any) -> Table:
    table = Table(expand=False, show_edge=False, pad_edge=False)
    for name in ("pos", "id", "token", "mask", "logprob", "version"):
        table.add_column(name)
    for i in range(start, end):
        tid, lp = r.response_ids[i], r.sampler_logprobs[i]
        cells = (
            str(i),
            str(tid),
            repr(decode(tid)),
            str(r.loss_mask[i]),
            f"{lp:.4f}",
            str(r.token_versions[i]),
        )
        table.add_row(*(Text(c) for c in cells))
    return table


def _token_decoder(store: ExperienceStore, console: Console) -> Any:
    """Decodes one token id with the run's tokenizer (`meta.tokenizer`); "" when it does not load."""
    path = store.meta.get("tokenizer")
    try:
        from ascent.models.loading import load_tokenizer  # deferred: torch; `ascent.cli` imports this module

        tok = load_tokenizer(path or "")
    except Exception as err:  # a moved or deleted model directory: the ids still print
        console.print(Text(f"token text unavailable ({err})", style="yellow"))
        return lambda tid: ""
    return lambda tid: tok.decode([tid], skip_special_tokens=False)


def _opt(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
