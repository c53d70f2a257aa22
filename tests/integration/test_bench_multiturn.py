"""bench/multiturn.py on CPU with the tiny shape: the four modes do the work the benchmark says they do
(reuse and reuse_masked prefill only each turn's new tokens, no_reuse the whole history, independent prompts
the same new tokens as reuse)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_multiturn_bench_counts_prefill_work(capsys) -> None:
    spec = importlib.util.spec_from_file_location("bench_multiturn", ROOT / "bench" / "multiturn.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    b, p, t, r, turns = 3, 16, 4, 5, 3
    res = bench.main(
        [
            "--device",
            "cpu",
            "--shape",
            "tiny",
            "--episodes",
            str(b),
            "--turns",
            str(turns),
            "--prompt-len",
            str(p),
            "--obs-len",
            str(t),
            "--response-len",
            str(r),
        ]
    )
    new = b * p + (turns - 1) * b * (t + 1)  # later turns: the observation and the last generated token
    history = sum(b * (p + k * (r + t)) for k in range(turns))
    reuse, plain, indep = res["reuse"], res["no_reuse"], res["independent"]
    assert (reuse["prefill_tokens"], reuse["reused_tokens"]) == (new, history - new)
    masked = res["reuse_masked"]
    assert (masked["prefill_tokens"], masked["reused_tokens"]) == (new, history - new)
    assert (plain["prefill_tokens"], plain["reused_tokens"]) == (history, 0)
    assert (indep["prefill_tokens"], indep["reused_tokens"]) == (new, 0)
    assert (
        reuse["generated_tokens"] == plain["generated_tokens"] == indep["generated_tokens"] == b * turns * r
    )
    assert reuse["max_context"] == plain["max_context"] == p + turns * r + (turns - 1) * t
    assert res["ratios"]["no_reuse_over_reuse_prefill"] == history / new
    assert "no_reuse_over_reuse_wall" in capsys.readouterr().out
