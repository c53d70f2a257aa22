"""The `math_verify` reward: symbolic equivalence of the response's final answer and the reference.

Wraps Hugging Face's `math-verify` package (parse both sides into SymPy, then `verify`). The response's answer
is found the package's way: `\\boxed{...}` first, then LaTeX and plain expressions. math-verify guards slow
SymPy work with `signal.alarm`, which only works on the main thread; off the main thread (a thread pool, a
threaded Ray actor) we pass no timeout instead of crashing, so the caller's own deadline must bound it.
The package is imported on first use: it pulls in SymPy, which is slow to import.
"""

from __future__ import annotations

import threading
from typing import Any

from ascent.rewards.builtin import answer_of


def _timeout(seconds: int | None) -> int | None:
    """math-verify's timeout for this thread: `seconds` on the main thread, None (no signals) elsewhere."""
    if seconds is None or seconds <= 0 or threading.current_thread() is not threading.main_thread():
        return None
    return int(seconds)


def parse_gold(answer: Any, timeout: int | None) -> list[Any]:
    """Parse a reference answer; bare LaTeX ("x+1", "(1,2)") is retried inside `$...$` and `\\boxed{}`."""
    from math_verify import parse  # deferred: math-verify, optional

    text = str(answer).strip()
    for candidate in (text, f"${text}$", f"\\boxed{{{text}}}"):
        parsed = parse(candidate, parsing_timeout=timeout)
        if parsed:
            return parsed
    raise ValueError(
        f"math_verify cannot parse the reference answer {text[:80]!r}; check the dataset's answers."
    )


def math_verify_reward(
    prompt: str,
    response: str,
    response_ids: list[int],
    metadata: dict[str, Any],
    *,
    answer_key: str = "answer",
    timeout_seconds: int | None = 5,
    float_rounding: int = 6,
    **_: Any,
) -> float:
    """1.0 if math-verify finds the response's answer equivalent to `metadata[answer_key]`, else 0.0.

    `timeout_seconds` bounds each parse and comparison on the main thread (see the module docstring).
    Raises ValueError when the reference itself cannot be parsed (a data problem, counted as a failure).
    """
    from math_verify import parse, verify  # deferred: math-verify, optional

    timeout = _timeout(timeout_seconds)
    gold = parse_gold(answer_of(metadata, answer_key, "math_verify"), timeout)
    pred = parse(response, parsing_timeout=timeout)
    if not pred:
        return 0.0
    return float(verify(gold, pred, float_rounding=float_rounding, timeout_seconds=timeout))
