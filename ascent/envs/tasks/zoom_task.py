"""Zoom questions: large synthetic images whose answer is a detail too fine to see without zooming in, for
the `zoom_qa` environment (`ascent.envs.image_env`) and, without the tool, `image_qa`.

Each image (`size` pixels square, default 448) is a light background with grey distractor shapes and,
in each of its four quarters, a framed square (`detail` pixels, default 12; at even pixels) filled with one of
`PATTERNS`: 1-pixel `horizontal` or `vertical` stripes, a 1-pixel `checkered` board, or `solid` grey of the
same mean. The question names a quarter ("What pattern fills the framed square in the top-left quarter of
the image?"); the answer is its pattern. The detail is the 1-pixel texture, not the square: shrunk to half
size, as a vision-language model's pixel budget does to a large image, every pattern averages to the same
grey (under 2 grey levels of std), however large the square; a zoom into its quarter (the crop, upscaled to
the image's size) brings the stripes back at the budget (about 60 grey levels of swing, checkers about 30).
A model that calls `zoom_in` on the right quarter can answer; one that cannot zoom can only guess (one in
four). A larger square (`examples/vision`: 40 px in 112 px images) makes the zoomed texture fill most of the
view, which a tiny vision tower reads more easily; the whole image still shows none of it.

`make_zoom_task(out_dir, n_rows, seed)` writes `rows.jsonl` and `val.jsonl`, each row `{"prompt", "answer",
"image" (a PNG data URI: rows carry their image, so a data folder moves as one file), "quarter", "box" (the
framed square's pixel box, for analysis and demonstrations), "env"}`; `env="image_qa"` writes the same task
for the environment without tools (the baseline of a learning comparison). `sft=True` also writes
`sft.jsonl`: for each training row, the conversation its environment plays when the model answers right
(`demonstration`: in `zoom_qa` it zooms into the named quarter first; played by the environment itself, so
it is token for token what an episode samples), its images as data URIs in content parts, for a supervised
warm-start before RL.
Command line: `python -m ascent.envs.tasks.zoom_task OUT --rows 400 --seed 0 [--size 448] [--env image_qa]
[--sft]`.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from ascent.envs.base import Message
from ascent.envs.image_env import ZoomQa
from ascent.envs.tasks.common import Shape, n_val_rows, write_rows
from ascent.envs.tools.image_tools import data_uri

PATTERNS = ("horizontal", "vertical", "checkered", "solid")
QUARTERS = {  # name -> (column, row) of the quarter
    "top-left": (0, 0),
    "top-right": (1, 0),
    "bottom-left": (0, 1),
    "bottom-right": (1, 1),
}
FRAME = (200, 30, 30)  # the red frame around each detail: visible at any size, so a model can find it
BORDER = 2  # the frame's width in pixels
QUESTION = "What pattern fills the framed square in the {quarter} quarter of the image?"


def pattern(name: str, side: int) -> np.ndarray:
    """A side x side grey pattern [side, side] of 0/255 pixels (mean 127.5), or solid 128."""
    y, x = np.mgrid[0:side, 0:side]
    cells = {"horizontal": y % 2, "vertical": x % 2, "checkered": (x + y) % 2}
    if name == "solid":
        return np.full((side, side), 128, dtype=np.uint8)
    return (cells[name] * 255).astype(np.uint8)


def draw_scene(
    rng: random.Random, size: int, detail: int
) -> tuple[Image.Image, dict[str, tuple[str, list[int]]]]:
    """A size x size image and, per quarter, (its pattern, the pixel box [x1, y1, x2, y2] of its framed
    square). The squares sit at even pixels, so a halving resize (the pixel budget) or a zoom into a quarter
    keeps their stripes in phase with the vision tower's patches."""
    image = Image.new("RGB", (size, size), (215, 215, 215))
    draw = ImageDraw.Draw(image)
    for _ in range(size // 16):  # distractors: grey shapes
        r = rng.randint(max(1, size // 64), max(2, size // 12))
        cx, cy, grey = rng.randrange(size), rng.randrange(size), rng.randint(90, 180)
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((cx - r, cy - r, cx + r, cy + r), fill=(grey, grey, grey))
    half = size // 2
    out: dict[str, tuple[str, list[int]]] = {}
    for quarter, (col, row) in QUARTERS.items():
        name = rng.choice(PATTERNS)
        x, y = (col * half + _even(rng, half, detail), row * half + _even(rng, half, detail))
        draw.rectangle((x - BORDER, y - BORDER, x + detail + BORDER - 1, y + detail + BORDER - 1), fill=FRAME)
        image.paste(Image.fromarray(pattern(name, detail)).convert("RGB"), (x, y))
        out[quarter] = (name, [x, y, x + detail, y + detail])
    return image, out


def _even(rng: random.Random, half: int, detail: int) -> int:
    """An even offset in a quarter of side `half` where a framed square of side `detail` fits whole."""
    return 2 * rng.randint((BORDER + 1) // 2 + 1, (half - detail - BORDER - 1) // 2)


def _rows(
    rng: random.Random, size: int, detail: int, env: str, quarters: Sequence[str]
) -> list[dict[str, Any]]:
    """The questions of one scene (one per quarter of `quarters`), sharing its image."""
    image, details = draw_scene(rng, size, detail)
    uri = data_uri(image)
    return [
        {
            "prompt": QUESTION.format(quarter=quarter),
            "answer": name,
            "image": uri,
            "quarter": quarter,
            "box": box,
            "env": env,
        }
        for quarter, (name, box) in details.items()
        if quarter in quarters
    ]


def demonstration(row: dict[str, Any]) -> dict[str, Any]:
    """The conversation of `row` played right, `{"messages": [...], "tools": [...]}` with the images as PNG
    data URIs: in `zoom_qa`, zoom into the named quarter (fractions of the image), then answer; in `image_qa`
    (the row's `env`), answer at once."""
    env = ZoomQa(use_tools=row.get("env", "zoom_qa") != "image_qa")
    messages = [*env.reset(row)]
    answer = {"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}
    if env.use_tools:
        col, line = QUARTERS[row["quarter"]]
        bbox = [col / 2, line / 2, col / 2 + 0.5, line / 2 + 0.5]
        action = f"<tool_call>{json.dumps({'name': 'zoom_in', 'arguments': {'bbox': bbox}})}</tool_call>"
        messages += [{"role": "assistant", "content": action}, *env.step(action).observation]
    messages.append(answer)
    return {"messages": [_portable(m) for m in messages], "tools": env.tools}


def _portable(message: Message) -> dict[str, Any]:
    """`message` with its images as data URIs (JSON-ready)."""
    content = message["content"]
    if isinstance(content, str):
        return dict(message)
    parts = [{**p, "image": data_uri(p["image"])} if p.get("type") == "image" else dict(p) for p in content]
    return {**message, "content": parts}


def make_zoom_task(
    out_dir: str | Path,
    n_rows: int,
    seed: int = 0,
    *,
    n_val: int | None = None,
    shape: Shape = "ascent",
    size: int = 448,
    detail: int = 12,
    env: str = "zoom_qa",
    sft: bool = False,
    quarters: Sequence[str] = tuple(QUARTERS),
) -> Path:
    """Write `rows.jsonl` (`n_rows` questions) and `val.jsonl` (`n_val`, default a tenth, about other images)
    to `out_dir`; return the path of `rows.jsonl`. `size`: the images' side in pixels; `detail`: the framed
    squares' side; `env`: `zoom_qa` (with the tool) or `image_qa` (without); `sft`: also write `sft.jsonl`,
    a demonstration per training row; `quarters`: the quarters questions ask about (default all four, one
    question each per image; one quarter makes where to zoom the same for every question)."""
    if not quarters or set(quarters) - set(QUARTERS):
        raise ValueError(f"quarters={list(quarters)}: choose among {', '.join(QUARTERS)}")
    if detail < 4 or size < 2 * (detail + 2 * BORDER + 4):
        raise ValueError(
            f"size={size}, detail={detail}: need detail >= 4 and size >= 2 * (detail + {2 * BORDER + 4}) "
            "(a framed square fits in a quarter)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)

    def questions(n: int) -> list[dict[str, Any]]:  # about scenes of their own: no image in both splits
        scenes = range(-(-n // len(quarters)))
        return [r for _ in scenes for r in _rows(rng, size, detail, env, quarters)][:n]

    train, val = questions(n_rows), questions(n_val_rows(n_rows, n_val))
    write_rows(out / "val.jsonl", rng.sample(val, len(val)), shape)
    train = rng.sample(train, len(train))
    if sft:
        write_rows(out / "sft.jsonl", [demonstration(r) for r in train])
    return write_rows(out / "rows.jsonl", train, shape)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write zoom questions: large images, details seen only zoomed."
    )
    parser.add_argument("out", type=Path, help="the folder to write the rows to")
    parser.add_argument("--rows", type=int, default=400, help="training rows (default 400)")
    parser.add_argument("--val", type=int, default=None, help="validation rows (default: a tenth of --rows)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of everything drawn (default 0)")
    parser.add_argument("--size", type=int, default=448, help="the images' side in pixels (default 448)")
    parser.add_argument("--detail", type=int, default=12, help="the detail's side in pixels (default 12)")
    parser.add_argument(
        "--env",
        choices=("zoom_qa", "image_qa"),
        default="zoom_qa",
        help="the rows' environment: zoom_qa (with the zoom_in tool) or image_qa (without: the baseline)",
    )
    parser.add_argument("--shape", choices=("ascent", "skyrl"), default="ascent", help="row shape")
    parser.add_argument(
        "--sft", action="store_true", help="also write sft.jsonl: a zoom-then-answer conversation per row"
    )
    args = parser.parse_args(argv)
    rows = make_zoom_task(
        args.out,
        args.rows,
        args.seed,
        n_val=args.val,
        shape=args.shape,
        size=args.size,
        detail=args.detail,
        env=args.env,
        sft=args.sft,
    )
    print(f"wrote {rows} and {rows.with_name('val.jsonl')}")


if __name__ == "__main__":
    main()
