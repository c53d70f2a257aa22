"""Rows for the `guess_number` game (`ascent.envs.base.GuessNumber`): a range and a number in it per row.

`make_guess_task(out_dir, n_rows, seed)` writes `rows.jsonl` and `val.jsonl`, each row `{"prompt", "answer"
(the number), "low", "high", "max_guesses", "env": "guess_number"}`: ranges of 10 to 100 numbers, and one
guess more than a binary search needs, so the game rewards halving the range on "higher" / "lower".
Command line: `python -m ascent.envs.tasks.guess_task OUT --rows 400 --seed 0 [--shape skyrl]`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ascent.envs.base import GuessNumber
from ascent.envs.tasks.common import Shape, main, n_val_rows, write_split

SPANS = (10, 20, 50, 100)  # how many numbers a range holds


def _row(rng: random.Random) -> dict[str, Any]:
    span = rng.choice(SPANS)
    low = rng.choice((0, 1, rng.randint(0, 900)))
    row = {
        "answer": rng.randint(low, low + span - 1),
        "low": low,
        "high": low + span - 1,
        "max_guesses": span.bit_length() + 1,
        "env": "guess_number",
    }
    (first,) = GuessNumber().reset(row)  # the prompt the game starts with, for readers and SkyRL's shape
    return {"prompt": first["content"], **row}


def make_guess_task(
    out_dir: str | Path, n_rows: int, seed: int = 0, *, n_val: int | None = None, shape: Shape = "ascent"
) -> Path:
    """Write `rows.jsonl` (`n_rows` games) and `val.jsonl` (`n_val`, default a tenth) to `out_dir`; return the
    path of `rows.jsonl`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = [_row(rng) for _ in range(n_rows + n_val_rows(n_rows, n_val))]
    return write_split(out, rng, rows, n_rows, len(rows), shape)


if __name__ == "__main__":
    main(make_guess_task, "Write rows of the guess_number game: a range and a number in it each.")
