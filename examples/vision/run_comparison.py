"""Does GRPO with the zoom tool beat the same model without it, and its own start? (issue #28)

    python examples/vision/run_comparison.py                 # CPU, 3 seeds (timings in README.md)
    python examples/vision/run_comparison.py --seeds 1 --iterations 5   # a quick look
    python examples/vision/run_comparison.py --place --val 64   # partly right start, 30 GRPO iterations
    python examples/vision/run_comparison.py --spread --seeds 2 --val 64   # robust start (the CI test's)

Steps, each a real CLI call (echoed): write a tiny Qwen2.5-VL checkpoint and the zoom task (`make_setup.py`:
112 px images, 40 px squares of 1-pixel stripes, 4 image tokens per image, so the stripes are readable only
zoomed), a warm start per arm from that one checkpoint in two stages, the same recipe for both arms on their
own demonstrations of the same questions (zoom then answer in `zoom_qa`; answer at once in `image_qa`):
stage 1 (`sft_read.yaml`, once, shared) trains the pattern word alone on the zoom demonstrations (the zoom
call at `weight: 0`, `turn_end_loss: false`), stage 2 (`sft.yaml`, per arm) the whole demonstrations: with
the tool a zoom into a quarter drawn at random and the pattern seen there (the start reads what it zooms
into but zooms anywhere: where to zoom is RL's to learn), without it the arm's own. Then per seed two GRPO runs (`grpo.yaml`): WITH the tool (`zoom_qa`)
and WITHOUT it (`image_qa`, the same questions, one look). Each run validates greedily on the held-out
questions at its start and at its end; the table is those accuracies (start, after GRPO) per arm and seed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ARMS = ("zoom", "plain")  # with the tool (zoom_qa rows), without it (image_qa rows)


def sh(*args: str) -> None:
    """Run one `ascent` command, echoing it; stop if it fails."""
    print(f"$ ascent {shlex.join(args)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "ascent", *args], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(proc.stdout)
        sys.exit(f"step failed: ascent {shlex.join(args)}")


def held_out_accuracy(run_dir: Path) -> tuple[float, float]:
    """A run's held-out accuracy (val/accuracy) at its start and at its end (metrics.jsonl)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    acc = [m["val/accuracy"] for m in map(json.loads, lines) if "val/accuracy" in m]
    return acc[0], acc[-1]


def grpo(root: Path, arm: str, seed: int, extra: list[str], grammar: bool) -> tuple[float, float]:
    """One GRPO run of `arm` (`zoom`: zoom_qa rows; `plain`: image_qa rows) from the arm's SFT start; with
    `grammar`, its turns sample under the arm's grammar (zoom.lark, answer.lark)."""
    run = root / f"grpo_{arm}_{seed}"
    shutil.rmtree(run, ignore_errors=True)
    env = "zoom_qa" if arm == "zoom" else "image_qa"
    if grammar:  # a JSON string is a YAML scalar: the grammar's colons stay text
        lark = (HERE / ("zoom.lark" if arm == "zoom" else "answer.lark")).read_text()
        extra = [*extra, f"rollout.grammar={json.dumps(lark)}", "rollout.max_new_tokens=32"]
    sh(
        "train",
        str(HERE / "grpo.yaml"),
        f"run_dir={run}",
        f"seed={seed}",
        f"model.path={root / f'sft_{arm}' / 'final'}",
        f"data.train_path={root / arm / 'rows.jsonl'}",
        f"data.val_path={root / arm / 'val.jsonl'}",
        f"rollout.source.env={env}",
        *extra,
    )
    return held_out_accuracy(run)


def grpo_turns(
    root: Path,
    arm: str,
    seed: int,
    extra: list[str],
    recipe: str = "grpo_turns.yaml",
    start: str = "sft_read",
) -> tuple[float, float]:
    """One GRPO run of `arm` from the warm start `start` under one grammar a turn (`recipe`: `grpo_turns.yaml`,
    or `grpo_place.yaml` for `--place`): with the tool a zoom call then the word; without it (`image_qa`,
    one look) the word alone."""
    run = root / f"{recipe.removesuffix('.yaml')}_{arm}_{seed}"
    shutil.rmtree(run, ignore_errors=True)
    turns = yaml.safe_load((HERE / recipe).read_text())["rollout"]["grammar"]
    word_only = json.dumps(turns[1:])  # without the tool: every turn the recipe's word grammar
    plain = [] if arm == "zoom" else ["rollout.source.env=image_qa", f"rollout.grammar={word_only}"]
    sh(
        "train",
        str(HERE / recipe),
        f"run_dir={run}",
        f"seed={seed}",
        f"model.path={root / start / 'final'}",
        f"data.train_path={root / arm / 'rows.jsonl'}",
        f"data.val_path={root / arm / 'val.jsonl'}",
        *plain,
        *extra,
    )
    return held_out_accuracy(run)


def sft(
    root: Path, name: str, recipe: str, data: Path, start: Path, epochs: float | None, *extra: str
) -> None:
    """One `ascent sft` stage into ROOT/name (`extra`: more overrides)."""
    run = root / name
    shutil.rmtree(run, ignore_errors=True)
    more = [f"epochs={epochs}"] if epochs else []
    args = (f"run_dir={run}", f"model.path={start}", f"data.train_path={data}", *more, *extra)
    sh("sft", str(HERE / recipe), *args)


def place_start(root: Path, read_epochs: float | None) -> None:
    """The `--place` warm start, once for both arms: `sft_read.yaml` on `read_plastic.jsonl` (reading rows
    and 128 rows training where to zoom, which keep it learnable), then `sft_place.yaml` (24 steps, half
    reading and half where-to-zoom rows: a start that zooms right more often than chance)."""
    zoom = root / "zoom"
    sft(root, "sft_plastic", "sft_read.yaml", zoom / "read_plastic.jsonl", root / "model", read_epochs)
    sft(root, "sft_place", "sft_place.yaml", zoom / "place.jsonl", root / "sft_plastic" / "final", None)


def spread_start(root: Path, sft_seed: int) -> None:
    """The `--spread` warm start, once for both arms: `sft_read.yaml` at lr 2e-3 on `read_plastic.jsonl`
    with a place row for every demonstration (it learns to read and to zoom into the asked quarter), then
    `sft_spread.yaml` (one epoch of rows zooming into the asked quarter 2 times in 5, and reading rows: a
    start that zooms right with the share its data fix). `sft_seed`: both stages' batch order."""
    zoom, seed = root / "zoom", f"seed={sft_seed}"
    plastic = zoom / "read_plastic.jsonl"
    sft(root, "sft_plastic", "sft_read.yaml", plastic, root / "model", None, seed, "train.lr=2e-3")
    sft(
        root,
        "sft_spread",
        "sft_spread.yaml",
        zoom / "spread.jsonl",
        root / "sft_plastic" / "final",
        None,
        seed,
    )


def warm_start(
    root: Path, read_epochs: float | None, format_epochs: float | None, stage_2: bool = True
) -> None:
    """The two-stage warm start from the one checkpoint: `sft_read.yaml` (the pattern word alone, on the
    zoom demonstrations) once, then (`stage_2`) `sft.yaml` per arm from it (its arm's whole demonstrations)."""
    stages = [("sft_read", "sft_read.yaml", root / "zoom" / "read.jsonl", root / "model", read_epochs)]
    for arm in ("zoom", "plain") if stage_2 else ():
        start = root / "sft_read" / "final"
        stages.append((f"sft_{arm}", "sft.yaml", root / arm / "format.jsonl", start, format_epochs))
    for name, recipe, data, start, epochs in stages:
        sft(root, name, recipe, data, start, epochs)


def main(argv: list[str] | None = None) -> None:
    """The comparison with `argv` (default: the command line)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("runs/vision"), help="where model, data and runs go")
    p.add_argument("--seeds", type=int, default=3, help="GRPO seeds per arm (default 3)")
    p.add_argument("--iterations", type=int, default=None, help="override grpo.yaml's iterations")
    p.add_argument("--read-epochs", type=float, default=None, help="override sft_read.yaml's epochs")
    p.add_argument("--format-epochs", type=float, default=None, help="override sft.yaml's epochs")
    p.add_argument("--rows", type=int, default=2048, help="training questions (and stage 1's demonstrations)")
    p.add_argument("--format-rows", type=int, default=256, help="stage 2's demonstrations")
    p.add_argument(
        "--no-place-loss",
        action="store_true",
        help="stage 2 leaves where to zoom out of the loss (`no_loss` on the box; measured: no better)",
    )
    p.add_argument(
        "--grammar",
        action="store_true",
        help="GRPO samples under zoom.lark / answer.lark (rollout.grammar): only well-formed calls and answers",
    )
    p.add_argument(
        "--turns",
        action="store_true",
        help="no stage 2: GRPO from stage 1 with one grammar a turn (grpo_turns.yaml; 300 iterations a run)",
    )
    p.add_argument(
        "--place",
        action="store_true",
        help="the partly right warm start (sft_read.yaml on read_plastic.jsonl, sft_place.yaml), then "
        "grpo_place.yaml (30 iterations, sampled validation); the recipe of README.md's newest status",
    )
    p.add_argument(
        "--spread",
        action="store_true",
        help="the robust warm start (stage 1 with a place row per demonstration, then sft_spread.yaml: "
        "right zooms 2 in 5 by its data), then grpo_spread.yaml; tests/integration/test_vision_learns.py",
    )
    p.add_argument("--sft-seed", type=int, default=0, help="--spread: the SFT stages' seed (batch order)")
    p.add_argument("--val", type=int, default=32, help="held-out questions")
    a = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from make_setup import make_setup

    t0 = time.time()
    plastic = {"n_plastic": a.rows} if a.spread else {}  # --spread: a place row for every demonstration
    make_setup(a.root, a.rows, n_val=a.val, n_format=a.format_rows, place_loss=not a.no_place_loss, **plastic)
    if a.spread:
        spread_start(a.root, a.sft_seed)
    elif a.place:
        place_start(a.root, a.read_epochs)
    else:
        warm_start(a.root, a.read_epochs, a.format_epochs)
    t_sft = time.time() - t0
    extra = [f"iterations={a.iterations}"] if a.iterations else []
    results, times = [], []
    for seed in range(1, a.seeds + 1):
        t1 = time.time()
        if a.place or a.spread:
            recipe, start = (
                ("grpo_spread.yaml", "sft_spread") if a.spread else ("grpo_place.yaml", "sft_place")
            )
            runs = (grpo_turns(a.root, arm, seed, extra, recipe, start) for arm in ARMS)
            zoom, plain = runs
        elif a.turns:
            zoom, plain = (grpo_turns(a.root, arm, seed, extra) for arm in ARMS)
        else:
            zoom, plain = (grpo(a.root, arm, seed, extra, a.grammar) for arm in ARMS)
        results.append((seed, zoom, plain))
        times.append(time.time() - t1)
    how = "sampled, 4 answers a question" if a.place or a.spread else "greedy"
    print(f"\nheld-out accuracy ({how}, {a.val} questions); setup + SFT {t_sft:.0f}s")
    print("seed | with tool: start -> GRPO | without tool: start -> GRPO | both arms' wall time")
    print("-----+--------------------------+-----------------------------+---------------------")
    for (seed, (z0, z1), (p0, p1)), t in zip(results, times, strict=True):
        print(f"{seed:4d} | {z0:10.3f} -> {z1:.3f}       | {p0:13.3f} -> {p1:.3f}          | {t:.0f}s")
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
