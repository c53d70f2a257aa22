"""Console progress of a run: a live rich bar on a terminal, plain one-line summaries everywhere.

`ascent train` and `ascent sft` call `progress.update(step, metrics)` after each iteration or optimizer step
(`step` counts finished ones, so the first call passes 1). Every call writes the summary line, e.g.
`it 3/10 | reward 0.410 | acc 0.40 | len 12.3 | kl 0.001 | 812 tok/s | 4.2s | eta 0:29`, to the run's log
file (`logs/controller.log`) and, at most once per `LINE_EVERY_S` seconds (always for the first step of the
process and the last step of the run, so every step when steps are slower than that), to the console. On a
terminal the bar (iteration i/N, elapsed, ETA, tokens/s, mean reward) stays at the bottom and the lines
scroll above it; when stdout is not a terminal (CI, Slurm logs, a pipe) there is no bar and no ANSI codes,
only the plain lines on stdout. Which metric keys feed the summary is the table `SUMMARY_FIELDS`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from ascent.tracking.logs import FILE_ONLY

log = logging.getLogger(__name__)
LINE_EVERY_S = 10.0  # console summary lines at most this often (the log file gets one per step)

# (label used in the bar, metric keys tried in order, format of the value in the summary line)
SUMMARY_FIELDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", ("reward/mean", "reward"), "reward {:.3f}"),
    ("acc", ("reward/accuracy", "accuracy"), "acc {:.2f}"),
    ("nll", ("sft/nll",), "nll {:.4f}"),
    ("len", ("rollout/response_len_mean", "response_length/mean"), "len {:.1f}"),
    ("kl", ("loss/kl", "train/kl", "kl"), "kl {:.2g}"),
    ("entropy", ("entropy", "train/entropy"), "ent {:.3f}"),
    ("val reward", ("val/reward_mean", "val/reward/mean"), "val {:.3f}"),
    ("val acc", ("val/accuracy",), "val acc {:.2f}"),
    ("val nll", ("val/nll",), "val nll {:.4f}"),
    ("tok/s", ("perf/tokens_per_s", "tokens_per_s"), "{:,.0f} tok/s"),
    ("time", ("time/iteration", "time/step"), "{:.1f}s"),
)


def _lookup(metrics: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    """The first of `keys` present in `metrics` with a numeric value."""
    for key in keys:
        value = metrics.get(key)
        if value is None or isinstance(value, str):
            continue
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None


def format_duration(seconds: float) -> str:
    """`H:MM:SS` (or `M:SS` under an hour)."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Iteration progress; a context manager. `enabled=False` shows no bar (summary lines still print)."""

    def __init__(
        self,
        total_iterations: int,
        *,
        enabled: bool = True,
        start_iteration: int = 0,
        stream: TextIO | None = None,
        line_every_s: float = LINE_EVERY_S,
    ) -> None:
        self.total = total_iterations
        self.start_iteration = start_iteration
        self.iteration = start_iteration
        self.stream = stream if stream is not None else sys.stdout
        self.live = enabled and _is_terminal(self.stream)
        self.line_every_s = line_every_s
        self._start_time = time.monotonic()
        self._last_line: float | None = None  # when the console last got a summary line
        self._bar: Any = None
        self._task: Any = None

    # lifecycle -------------------------------------------------------------------------------------
    def start(self) -> Progress:
        """Show the bar (terminal only). Called by `__enter__`."""
        if self.live and self._bar is None:
            self._bar = _make_bar(self.stream)
            self._task = self._bar.add_task(
                "train", total=self.total, completed=self.start_iteration, eta="?", stats=""
            )
            self._bar.start()
        return self

    def close(self) -> None:
        """Remove the live display (the last state stays on screen)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # updates ---------------------------------------------------------------------------------------
    def update(self, iteration: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Record that `iteration` iterations are done: refresh the bar's ETA, tokens/s and reward, log the
        summary line to the log file, and print it on the console when one is due (see the module)."""
        self.iteration = iteration
        metrics = metrics or {}
        line = self.summary_line(iteration, metrics)
        log.info(line, extra=FILE_ONLY)
        now = time.monotonic()
        if self._last_line is None or now - self._last_line >= self.line_every_s or iteration >= self.total:
            self._last_line = now
            self.print(line)
        if self._bar is not None:
            self._refresh_bar(iteration, metrics)

    def _refresh_bar(self, iteration: int, metrics: Mapping[str, Any]) -> None:
        stats = [
            template.format(value)
            for label, keys, template in SUMMARY_FIELDS
            if label in ("reward", "tok/s") and (value := _lookup(metrics, keys)) is not None
        ]
        eta = self.eta_s(iteration)
        self._bar.update(
            self._task,
            completed=iteration,
            eta=format_duration(eta) if eta is not None else "?",
            stats=" | ".join(stats),
        )

    def eta_s(self, iteration: int) -> float | None:
        """Seconds left, from the mean pace of the iterations done in this process (None before the first)."""
        done = iteration - self.start_iteration
        if done <= 0:
            return None
        pace = (time.monotonic() - self._start_time) / done
        return pace * max(0, self.total - iteration)

    def summary_line(self, iteration: int, metrics: Mapping[str, Any]) -> str:
        """One compact line: `it 3/10 | reward 0.410 | acc 0.40 | ... | 4.2s | eta 0:29`."""
        parts = [f"it {iteration}/{self.total}"]
        for _label, keys, template in SUMMARY_FIELDS:
            value = _lookup(metrics, keys)
            if value is not None:
                parts.append(template.format(value))
        eta = self.eta_s(iteration)
        if eta is not None and iteration < self.total:
            parts.append(f"eta {format_duration(eta)}")
        return " | ".join(parts)

    def print(self, text: str) -> None:
        """Print a line above the bar (terminal) or as a plain line (no bar, no ANSI codes)."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _make_bar(stream: TextIO) -> Any:
    """The rich progress display: description, bar, i/N, elapsed, ETA, stats."""
    # deferred: rich, only for console output
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    return RichProgress(
        TextColumn("[bold]it"),
        MofNCompleteColumn(),
        BarColumn(),
        TimeElapsedColumn(),
        TextColumn("eta {task.fields[eta]}"),
        TextColumn("{task.fields[stats]}"),
        console=Console(file=stream),
        refresh_per_second=2,
        transient=False,
    )
