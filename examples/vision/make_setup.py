"""The zoom task's data and a tiny vision-language checkpoint for it (issue #28's learning comparison).

The task: `python -m ascent.envs.tasks.zoom_task` at 112 pixels with 40-pixel framed squares of 1-pixel
stripes; the checkpoint's pixel budget (4 image tokens, 56 x 56 pixels: min_pixels = max_pixels = 3136)
halves the image, so every pattern averages to a flat grey (std under 2 grey levels), while a zoom into a
quarter comes back at full resolution (stripes swing ~60 grey levels) and fills most of the view. The
tokenizer is the tiny model's character tokenizer with the task's fixed texts as whole tokens (the system prompts, the question, the tool call's head, the pattern
names, the four quarters' boxes in the zoom call): a real tokenizer compresses such text several times
over, and with one token per character an episode would be ten times longer than it needs to be; with them,
the call is five tokens and where to zoom is the choice of one. Usage: `python examples/vision/make_setup.py OUT`
writes OUT/model, OUT/zoom (rows for `zoom_qa`) and OUT/plain (the same rows for `image_qa`), each with
`sft.jsonl`, its arm's warm-start demonstrations (zoom then answer; answer at once), and the two stages
of the warm start made from them: `read.jsonl` (the pattern word alone in the loss) and `format.jsonl`
(whole demonstrations; with the tool, `wandering`: a zoom into a random quarter, answered with what it shows).
`--shape 3b --device cuda`: the same tokenizer and pixel budget over Qwen2.5-VL-3B's dimensions, random
weights in bf16 (`gpu_run.py`'s real-size run).
OUT/zoom also gets the `--place` warm start's stages (`write_places`): `read_plastic.jsonl` and `place.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from run_watch import BOXES  # beside this file: the zoom call's box per quarter, also gpu_run.py's scoring

from ascent.envs.image_env import SYSTEM, SYSTEM_NO_TOOLS
from ascent.envs.tasks.common import write_rows
from ascent.envs.tasks.zoom_task import PATTERNS, QUARTERS, QUESTION, demonstration, make_zoom_task
from ascent.models.tiny_vl import QWEN2_5_VL_3B_TEXT, QWEN2_5_VL_3B_VISION, make_tiny_vl_checkpoint

SIZE, DETAIL, TOKENS = 112, 40, 4  # image side, framed square's side (pixels), image tokens per image
UNIT = 28 * 28  # pixels of one Qwen2.5-VL image token (a 2 x 2 merge of 14-pixel patches)
HALF = SIZE // 2
CALL_HEAD = ("<tool_call>", '{"name": "zoom_in", "arguments": {"bbox": [')  # the zoom call up to its box
WORDS = [
    SYSTEM,
    SYSTEM_NO_TOOLS,
    *(QUESTION.format(quarter=q) for q in QUARTERS),
    *PATTERNS,
    "<answer>",
    "</answer>",
    "<tool_call>",
    "</tool_call>",
    CALL_HEAD[1],
    "]}}",
    *BOXES.values(),  # the quarters' boxes
    *(f"[{c * HALF}, {r * HALF}, {c * HALF + HALF}, {r * HALF + HALF}]" for c, r in QUARTERS.values()),
    "Image 0 (the image):",
    "Zoomed into ",
    " of image 0:",
    "Image 1 (zoom of image 0 at ",
]
# `--shape`: the checkpoint's dimensions (text, vision); None keeps the tiny model's (`hidden_size` wide).
# `3b` is Qwen2.5-VL-3B's, random weights in bf16, over the same tokenizer and pixel budget (the same task).
SHAPES = {"tiny": (None, None), "3b": (QWEN2_5_VL_3B_TEXT, QWEN2_5_VL_3B_VISION)}


def reading(demo: dict[str, Any]) -> dict[str, Any]:
    """Stage 1 of the warm start: `demo` with its earlier model turns (the zoom call) at weight 0 and its
    answer the pattern word alone, so the loss (with `turn_end_loss=false`) is on that one token."""
    *before, answer = demo["messages"]
    word = answer["content"].removeprefix("<answer>").removesuffix("</answer>")
    weighted = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in before]
    return {**demo, "messages": [*weighted, {"role": "assistant", "content": word}]}


def wandering(rows: list[dict[str, Any]], seed: int, n: int) -> list[dict[str, Any]]:
    """Stage 2's demonstrations: for each of the first `n` rows, the conversation that zooms into a quarter
    drawn at random (not the one the question names) and answers the pattern seen there, so the start reads
    what it zooms into but zooms anywhere (one in four right): where to zoom is RL's to learn. Rows of one
    scene share its image, which gives every quarter's pattern (from all `rows`). The first `n` of all rows'
    demonstrations, without playing the rest (a demonstration renders its images: seconds per thousand)."""
    seen: dict[str, dict[str, str]] = {}
    for r in rows:
        seen.setdefault(r["image"], {})[r["quarter"]] = r["answer"]
    rng = random.Random(seed)
    demos = []
    for r in rows[:n]:
        quarter = rng.choice(sorted(seen[r["image"]]))
        demos.append(demonstration({**r, "quarter": quarter, "answer": seen[r["image"]][quarter]}))
    return demos


def placeless(demo: dict[str, Any]) -> dict[str, Any]:
    """`demo` with the zoom call's box (where to zoom, one token) out of the loss (`no_loss`): the call's
    format is trained, its place is not, so the place stays free to follow the question under RL."""
    boxes = [f"{c / 2}, {r / 2}, {c / 2 + 0.5}, {r / 2 + 0.5}" for c, r in QUARTERS.values()]
    out = []
    for m in demo["messages"]:
        box = [b for b in boxes if m["role"] == "assistant" and b in str(m["content"])]
        out.append({**m, "no_loss": box} if box else m)
    return {**demo, "messages": out}


def placing(demo: dict[str, Any]) -> dict[str, Any]:
    """`demo` up to its zoom call, the call's fixed text out of the loss (`no_loss`): the loss is on where to
    zoom alone (one token, with `turn_end_loss: false`), the asked quarter."""
    messages = demo["messages"]
    i = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    call = {**messages[i], "no_loss": [CALL_HEAD[0], CALL_HEAD[1], "]}}", "</tool_call>"]}
    return {**demo, "messages": [*messages[:i], call]}


def spreading(demo: dict[str, Any], asked: str, repeats: dict[str, int]) -> list[dict[str, Any]]:
    """`placing(demo)` (its question about `asked`) once per zoom target: `repeats[quarter]` rows whose
    call names `quarter`'s box. Trained to convergence on such rows, the probability of zooming into each
    quarter given the question is its share of the rows: fixed by the data, not by when training stops."""
    row = placing(demo)
    *before, call = row["messages"]
    out = []
    for quarter, n in repeats.items():
        content = call["content"].replace(BOXES[asked], BOXES[quarter])
        out += [{**row, "messages": [*before, {**call, "content": content}]}] * n
    return out


def write_spread(arm: Path, n_questions: int, seed: int, asked_share: int = 2) -> None:
    """ARM/spread.jsonl, stage 2 of the robust warm start (`sft_spread.yaml`): for each of `n_questions`
    demonstrations, `asked_share` rows zooming into the asked quarter and one into each other quarter (a
    target of 2/5 right), and as many `reading` rows of other demonstrations, shuffled."""
    demos = [json.loads(line) for line in (arm / "sft.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (arm / "rows.jsonl").read_text().splitlines()]
    spread = []
    for demo, row in zip(demos[:n_questions], rows, strict=False):
        repeats = {q: asked_share if q == row["quarter"] else 1 for q in QUARTERS}
        spread += spreading(demo, row["quarter"], repeats)
    rest = demos[n_questions : n_questions + len(spread)]
    mixed = [*spread, *map(reading, rest)]
    random.Random(seed).shuffle(mixed)
    write_rows(arm / "spread.jsonl", mixed)


def write_places(arm: Path, n_plastic: int, seed: int) -> None:
    """The `--place` warm start's stages (zoom arm only): ARM/read_plastic.jsonl, every `reading` row and
    `n_plastic` `placing` rows (too few to teach the place, enough to keep it learnable: stage 1 on reading
    rows alone leaves it at chance even under cross-entropy), and ARM/place.jsonl, the first half of the
    demonstrations as `reading` rows and the second half as `placing` rows, shuffled (`sft_place.yaml` takes
    a few steps of it: a start that zooms right more often than chance and still reads)."""
    demos = [json.loads(line) for line in (arm / "sft.jsonl").read_text().splitlines()]
    write_rows(arm / "read_plastic.jsonl", [*(reading(d) for d in demos), *map(placing, demos[:n_plastic])])
    half = len(demos) // 2
    mixed = [*(reading(d) for d in demos[:half]), *(placing(d) for d in demos[half:])]
    random.Random(seed).shuffle(mixed)
    write_rows(arm / "place.jsonl", mixed)


def write_stages(arm: Path, n_format: int, seed: int, place_loss: bool = True) -> None:
    """ARM/read.jsonl (every demonstration, `reading`) and ARM/format.jsonl (`n_format` whole
    demonstrations: with the tool `wandering`, without it the arm's own; `place_loss=False`: `placeless`)."""
    demos = [json.loads(line) for line in (arm / "sft.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (arm / "rows.jsonl").read_text().splitlines()]
    write_rows(arm / "read.jsonl", [reading(r) for r in demos])
    tool = rows[0]["env"] == "zoom_qa"
    format_rows = wandering(rows, seed, n_format) if tool else demos[:n_format]
    write_rows(arm / "format.jsonl", format_rows if place_loss else [placeless(d) for d in format_rows])


def make_setup(
    out: Path,
    rows: int = 256,
    seed: int = 0,
    n_val: int = 32,
    hidden_size: int = 64,
    n_format: int = 64,
    place_loss: bool = True,
    n_plastic: int = 128,
    shape: str = "tiny",
    device: str = "cpu",
) -> Path:
    """Write OUT/model (`shape`: SHAPES; initialised on `device`), OUT/zoom and OUT/plain (see module doc;
    `write_places` for OUT/zoom's `--place` stages); return `out`."""
    text, vision = SHAPES[shape]
    make_tiny_vl_checkpoint(
        out / "model",
        hidden_size=hidden_size,
        min_pixels=TOKENS * UNIT,
        max_pixels=TOKENS * UNIT,
        words=WORDS,
        seed=seed,
        text=text,
        vision=vision,
        dtype="fp32" if text is None else "bf16",
        device=device,
    )
    for name, env in (("zoom", "zoom_qa"), ("plain", "image_qa")):
        make_zoom_task(out / name, rows, seed, n_val=n_val, size=SIZE, detail=DETAIL, env=env, sft=True)
        write_stages(out / name, n_format, seed, place_loss)
    write_places(out / "zoom", min(n_plastic, rows), seed)
    write_spread(out / "zoom", min(256, rows // 8), seed)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val", type=int, default=32, help="held-out questions")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="the checkpoint's dimensions")
    parser.add_argument("--device", default="cpu", help="where the weights are initialised (cuda for 3b)")
    args = parser.parse_args()
    out = make_setup(args.out, args.rows, args.seed, n_val=args.val, shape=args.shape, device=args.device)
    paths = {name: str(out / name) for name in ("model", "zoom", "plain")}
    print(json.dumps(paths))


if __name__ == "__main__":
    main()
