"""Progress: summary lines, plain output when not on a terminal, the rich bar on one."""

from __future__ import annotations

import io

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


def test_not_a_terminal_prints_plain_lines():
    out = io.StringIO()
    with Progress(3, stream=out) as progress:
        assert not progress.live
        for i in range(1, 4):
            progress.update(i, METRICS)
            progress.print(progress.summary_line(i, METRICS))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("it 1/3 | reward 0.410")
    assert "\x1b" not in out.getvalue()
    assert "eta" in lines[0] and "eta" not in lines[-1]


def test_terminal_shows_a_bar():
    out = FakeTerminal()
    with Progress(4, stream=out, start_iteration=1) as progress:
        assert progress.live
        progress.update(2, METRICS)
        progress.print("a line [not markup]")
    text = out.getvalue()
    assert "2/4" in text and "a line [not markup]" in text and "812 tok/s" in text
