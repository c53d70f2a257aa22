"""Progress: summary lines, plain output when not on a terminal, the rich bar on one."""

from __future__ import annotations

import io
import logging

from ascent.tracking import Progress

METRICS = {
    "reward/mean": 0.41,
    "reward/accuracy": 0.4,
    "response_length/mean": 12.34,
    "train/kl": 0.001,
    "perf/tokens_per_s": 812.2,
    "time/iteration": 4.21,
}


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_summary_line_is_compact():
    line = Progress(10, enabled=False).summary_line(3, METRICS)
    assert line.startswith("it 3/10 | reward 0.410 | acc 0.40 | len 12.3 | kl 0.001 | 812 tok/s | 4.2s")


def test_summary_line_skips_missing_and_survives_nan():
    progress = Progress(5, enabled=False)
    assert progress.summary_line(5, {}) == "it 5/5"
    assert "reward nan" in progress.summary_line(1, {"reward/mean": float("nan"), "text": "x"})


def test_not_a_terminal_prints_plain_lines_paced_and_logs_every_step(caplog):
    """Off a terminal (a pipe, CI, a Slurm log) each update that is due prints one plain line: the first, the
    last, and one per `line_every_s` between them; the log file gets every step."""
    out = io.StringIO()
    with (
        caplog.at_level(logging.INFO, logger="ascent"),
        Progress(5, stream=out, line_every_s=3600) as progress,
    ):
        assert not progress.live
        for i in range(1, 6):
            progress.update(i, METRICS)
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["it 1/5", "it 5/5"]
    assert lines[0].startswith("it 1/5 | reward 0.410") and "812 tok/s" in lines[0]
    assert "\x1b" not in out.getvalue()
    assert "eta" in lines[0] and "eta" not in lines[-1]
    logged = [r for r in caplog.records if r.getMessage().startswith("it ")]
    assert [r.getMessage().split(" | ")[0] for r in logged] == [f"it {i}/5" for i in range(1, 6)]
    assert all(r.ascent_console is False for r in logged)  # the console gets them through Progress only


def test_steps_slower_than_the_pace_print_every_step():
    out = io.StringIO()
    with Progress(3, stream=out, start_iteration=1, line_every_s=0.0) as progress:
        for i in (2, 3):
            progress.update(i, METRICS)
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == ["it 2/3", "it 3/3"]


def test_terminal_shows_a_bar():
    out = FakeTerminal()
    with Progress(4, stream=out, start_iteration=1) as progress:
        assert progress.live
        progress.update(2, METRICS)
        progress.print("a line [not markup]")
    text = out.getvalue()
    assert "2/4" in text and "a line [not markup]" in text and "812 tok/s" in text
