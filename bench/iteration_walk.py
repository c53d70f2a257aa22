"""How far a reader walks to follow one iteration: file-to-file stops from `ascent train` to a publication.

    python bench/iteration_walk.py [--root /tmp/iteration_walk] [--json walk.json] [--path]

Runs one real `ascent train` iteration on CPU (a tiny model from `ascent.models.tiny`, the arithmetic data of
examples/arithmetic, as tests/integration builds them; rewards scored inline, so the counts do not depend on
how long a reward process takes to answer on a loaded machine) under `sys.setprofile`, which sees the calls and
returns of the controller thread only (worker threads and processes are not followed). Only frames of
files under ascent/ count; a library in between (typer, torch) is transparent. Each time the innermost
ascent frame changes file is a **stop**; a stop into a file the walk had already left is a **return to a
file already left** (a revisit, whether a call or a return brought it there).

Two walks are counted, each over two spans (`ascent train` to the end of iteration 1's publication, and
iteration 1 alone: `loop.run_iteration` from its call to the return of its `publish_weights`):
- **every call**: execution as it happens, loops and repeated helpers included;
- **reader**: each function read once: the frame of a function the walk has already entered is transparent
  (a reader who knows `pack` does not open it again for the next micro-batch), but a function it calls for
  the first time is followed (the trainer's `update` behind a `call_split` already read). This is the walk
  issue #27 counted by hand ("62 stops, 42 of them returns to a file already left").

Prints, per walk and span: stops, revisits (by call and by return), files visited, the top files by entries;
`--path` also prints the reader's path file by file (consecutive stops collapsed), as docs/contracts.md
quotes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
ASCENT = str(ROOT / "ascent") + "/"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))

from ascent.cli import main as ascent_main  # noqa: E402
from ascent.models.tiny import make_tiny_checkpoint  # noqa: E402
from ascent.orchestrator import loop  # noqa: E402

ITERATION = loop.run_iteration.__code__
PUBLISH = loop.publish_weights.__code__


@dataclass
class Walk:
    """The stops of one walk. A `reader` reads each function once: a frame of a function it has read before
    is transparent (the reader stays where it stands), but what that frame calls for the first time is
    followed from there (the second `call_split` is not reread, the new worker method it runs is read)."""

    reader: bool
    stack: list[bool] = field(default_factory=list)  # per ascent frame: does the walk stand in it
    standing: list[str] = field(default_factory=list)  # the files of the frames it stands in, innermost last
    known: set[Any] = field(default_factory=set)
    stops: list[tuple[str, str, str]] = field(default_factory=list)  # (from, to, "call" | "return")

    def call(self, code: Any) -> None:
        new = not (self.reader and code in self.known)
        self.known.add(code)
        self.stack.append(new)
        if new:
            self._move(code.co_filename, "call")
            self.standing.append(code.co_filename)

    def ret(self) -> None:
        if self.stack and self.stack.pop():
            left = self.standing.pop()
            if self.standing:
                self._move(self.standing[-1], "return", left)

    def _move(self, there: str, how: str, here: str | None = None) -> None:
        here = here or (self.standing[-1] if self.standing else None)
        if here is not None and here != there:
            self.stops.append((here, there, how))


class Tracer:
    """The profile function: feeds every walk, opens the iteration's walks at `run_iteration` and stops
    everything when iteration 1's `publish_weights` returns."""

    def __init__(self) -> None:
        self.whole = {"every call": Walk(reader=False), "reader": Walk(reader=True)}
        self.iteration: dict[str, Walk] = {}
        self.publishes = 0
        self.done = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return") or not frame.f_code.co_filename.startswith(ASCENT):
            return
        code = frame.f_code
        if event == "call" and code is ITERATION and not self.iteration:
            self.iteration = {"every call": Walk(reader=False), "reader": Walk(reader=True)}
        for walk in [*self.whole.values(), *self.iteration.values()]:
            if event == "call":
                walk.call(code)
            else:
                walk.ret()
        if event == "return" and code is PUBLISH and self.iteration:
            self.done = True
            sys.setprofile(None)  # iteration 1 is published: the rest of the run goes untraced


def setup(root: Path) -> Path:
    """A tiny model, the arithmetic data and a one-iteration config (tests/integration's run_config)."""
    from make_data import make

    model = make_tiny_checkpoint(root / "model", hidden_size=32, num_layers=2, seed=0)
    data = make(root / "data", digits=1, sft=40, train=40, val=16, seed=0)
    cfg = {
        "run_dir": str(root / "run"),
        "seed": 3,
        "iterations": 1,
        "model": {"path": str(model)},
        "data": {"train_path": str(data / "train.jsonl"), "max_prompt_tokens": 32},
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 4},
        "train": {"lr": 1e-3, "trajectories_per_update": 4, "max_tokens_per_micro_batch": 64},
        "tracking": {"progress": False, "tensorboard": False},
        "reward": {"isolation": "inline"},  # no pool to wait on: a loaded machine's waits add no stops
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def summary(walk: Walk, top: int) -> dict[str, Any]:
    revisits = []
    seen: set[str] = set()
    for here, there, how in walk.stops:
        seen.add(here)
        if there in seen:
            revisits.append(how)
        seen.add(there)
    entries = Counter(short(there) for _, there, _ in walk.stops)
    return {
        "stops": len(walk.stops),
        "revisits": len(revisits),
        "revisits_by_return": revisits.count("return"),
        "revisits_by_call": revisits.count("call"),
        "files": len(seen),
        "top_files": entries.most_common(top),
    }


def path_of(walk: Walk) -> list[str]:
    """The files the walk stands in, in order (a file repeated only after another one came between)."""
    return [short(walk.stops[0][0]), *(short(there) for _, there, _ in walk.stops)] if walk.stops else []


def short(file: str) -> str:
    return file.removeprefix(str(ROOT) + "/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="/tmp/iteration_walk", help="Where the model, data and run go.")
    parser.add_argument("--top", type=int, default=8, help="How many files to list by entries.")
    parser.add_argument("--json", help="Also write the counts (and the reader's paths) to this file.")
    parser.add_argument("--path", action="store_true", help="Print the reader's path, file by file.")
    args = parser.parse_args()
    root = Path(args.root)
    if (root / "run").exists():
        sys.exit(f"--root {root}: holds a run already; pass a new --root (or remove {root / 'run'}).")
    config = setup(root)
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        ascent_main(["train", str(config)])
    except SystemExit as done:
        if done.code:
            raise
    finally:
        sys.setprofile(None)
    if not tracer.done:
        sys.exit("the run ended before iteration 1 published its weights: nothing to report")
    report: dict[str, Any] = {}
    for span, walks in (
        ("ascent train -> iteration 1 published", tracer.whole),
        ("iteration 1", tracer.iteration),
    ):
        for name, walk in walks.items():
            counts = summary(walk, args.top)
            report[f"{span} / {name}"] = counts | {"path": path_of(walk)}
            print(
                f"{span}, {name}: {counts['stops']} stops, {counts['revisits']} returns to a file already "
                f"left ({counts['revisits_by_return']} by a return, {counts['revisits_by_call']} by a call), "
                f"{counts['files']} files"
            )
            print("    top files by entries: " + ", ".join(f"{f} {n}" for f, n in counts["top_files"]))
    if args.path:
        for span, walks in (
            ("ascent train -> iteration 1 published", tracer.whole),
            ("iteration 1", tracer.iteration),
        ):
            print(f"\nreader's path, {span}:")
            print("  " + " -> ".join(path_of(walks["reader"])))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
