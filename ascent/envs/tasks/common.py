"""What the generated tasks share: fictional names from a seeded RNG, the train/val split, writing rows in
ascent's shape or SkyRL-gym's, and each generator's command line (`OUT --rows N --val N --seed S --shape`).

Everything is drawn from one `random.Random(seed)`, so a seed gives the same data on any machine.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

Shape = Literal["ascent", "skyrl"]

FIRST_NAMES = (
    "Ada",
    "Bruno",
    "Clara",
    "Dario",
    "Elena",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Lars",
    "Mira",
    "Nils",
    "Olga",
    "Pavel",
    "Rosa",
    "Sami",
    "Tilda",
    "Umar",
    "Vera",
    "Yusuf",
)
LAST_NAMES = (
    "Novak",
    "Berg",
    "Costa",
    "Dahl",
    "Eklund",
    "Fischer",
    "Garcia",
    "Horvat",
    "Ivanova",
    "Jensen",
    "Kowalski",
    "Lindqvist",
    "Moreau",
    "Nagy",
    "Ortega",
    "Petrov",
    "Quist",
    "Rossi",
    "Sato",
    "Tanaka",
    "Varga",
    "Weber",
    "Yilmaz",
    "Zeman",
)
SYLLABLES = (
    "al",
    "bar",
    "bel",
    "cor",
    "dal",
    "dor",
    "el",
    "fen",
    "gal",
    "hal",
    "ith",
    "kal",
    "kor",
    "lan",
    "mir",
    "mor",
    "nar",
    "ol",
    "qua",
    "ras",
    "ril",
    "sel",
    "tar",
    "thal",
    "ush",
    "val",
    "ven",
    "vor",
    "wen",
    "yr",
    "zan",
    "zor",
)


def made_up_names(rng: random.Random, n: int, avoid: Iterable[str] = ()) -> list[str]:
    """`n` different made-up words ("Tarvel", "Ushmir"), none equal (case aside) to a word of `avoid`."""
    taken = {w.lower() for w in avoid}
    names: list[str] = []
    while len(names) < n:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 2, 3)))).capitalize()
        if word.lower() not in taken:
            taken.add(word.lower())
            names.append(word)
    return names


def person_names(rng: random.Random, n: int) -> list[str]:
    """`n` different "First Last" names; no two share a last name when `n` <= len(LAST_NAMES)."""
    if n > len(FIRST_NAMES) * len(LAST_NAMES):
        raise ValueError(f"at most {len(FIRST_NAMES) * len(LAST_NAMES)} different names")
    last = rng.sample(LAST_NAMES, min(n, len(LAST_NAMES)))
    pairs = [(rng.choice(FIRST_NAMES), surname) for surname in last]
    others = [(f, s) for f in FIRST_NAMES for s in LAST_NAMES if (f, s) not in pairs]
    pairs += rng.sample(others, n - len(pairs))
    return [f"{first} {surname}" for first, surname in pairs]


def interleave(rng: random.Random, pools: Sequence[list[Any]]) -> Iterable[Any]:
    """The items of `pools` round-robin (each pool shuffled, a pool's turn skipped once it is empty), so
    every prefix mixes the pools (the question templates) evenly."""
    queues = [rng.sample(pool, len(pool)) for pool in pools]
    while any(queues):
        for queue in queues:
            if queue:
                yield queue.pop()


def split(rng: random.Random, rows: list[dict[str, Any]], n_rows: int) -> tuple[list[Any], list[Any]]:
    """Shuffle `rows`; the first `n_rows` train, the rest validate."""
    rows = rng.sample(rows, len(rows))
    return rows[:n_rows], rows[n_rows:]


def write_split(
    out: Path,
    rng: random.Random,
    rows: list[dict[str, Any]],
    n_rows: int,
    wanted: int,
    shape: Shape,
    world: tuple[str, str] = ("source", "sources"),
) -> Path:
    """Shuffle `rows` into `out/rows.jsonl` (the first `n_rows`) and `out/val.jsonl` (the rest); an error when
    one `world` (a shop, a corpus) could not give the `wanted` different questions. Returns the train file."""
    if len(rows) < wanted:
        raise ValueError(
            f"n_rows + n_val = {wanted}: one {world[0]} has only {len(rows)} different questions; ask for "
            f"fewer, or generate more {world[1]} (other seeds, other folders) and concatenate their rows."
        )
    train, val = split(rng, rows, n_rows)
    write_rows(out / "val.jsonl", val, shape)
    return write_rows(out / "rows.jsonl", train, shape)


def to_skyrl(row: dict[str, Any]) -> dict[str, Any]:
    """An ascent row in SkyRL-gym's shape: messages, `env_class`, `reward_spec`, the rest in `extra_info`."""
    rest = {k: v for k, v in row.items() if k not in ("prompt", "answer", "env")}
    return {
        "prompt": [{"role": "user", "content": row["prompt"]}],
        "env_class": row["env"],
        "reward_spec": {"method": "rule", "ground_truth": row["answer"]},
        "extra_info": rest,
    }


def write_rows(path: Path, rows: Iterable[dict[str, Any]], shape: Shape = "ascent") -> Path:
    """One JSON object a line, in `shape`; returns `path`."""
    with open(path, "w") as f:
        f.writelines(json.dumps(to_skyrl(r) if shape == "skyrl" else r) + "\n" for r in rows)
    return path


def n_val_rows(n_rows: int, n_val: int | None) -> int:
    return max(1, n_rows // 10) if n_val is None else n_val


def main(make: Callable[..., Path], description: str, argv: Sequence[str] | None = None) -> None:
    """The command line of a generator `make(out_dir, n_rows, seed, n_val=..., shape=...) -> rows path`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", type=Path, help="the folder to write the data and the rows to")
    parser.add_argument("--rows", type=int, default=400, help="training rows (default 400)")
    parser.add_argument("--val", type=int, default=None, help="validation rows (default: a tenth of --rows)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of everything drawn (default 0)")
    parser.add_argument(
        "--shape",
        choices=("ascent", "skyrl"),
        default="ascent",
        help="row shape: ascent's flat columns, or SkyRL-gym's (env_class, reward_spec)",
    )
    args = parser.parse_args(argv)
    rows = make(args.out, args.rows, args.seed, n_val=args.val, shape=args.shape)
    print(
        f"wrote {rows} and {rows.with_name('val.jsonl')} ({args.rows} + {n_val_rows(args.rows, args.val)} "
        "rows)"
    )
