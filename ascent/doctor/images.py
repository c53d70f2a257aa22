"""Doctor check of the images a run shows its model: the pixel budget (`model.min_pixels` /
`model.max_pixels`, else the checkpoint's preprocessor_config.json), how many image tokens each image of the
first rows becomes (min / median / max), and the rows whose images cannot be used (missing, unreadable, not
an image), which the run would leave out. Images in the data of a text-only model fail here, before a run.

Reads the first `HEAD_ROWS` rows of `data.train_path` only, as the data checks do.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ascent.config.schema import RunConfig
from ascent.data.images import BadImageRow, decode_images, row_has_images
from ascent.doctor.data import HEAD_ROWS, HeadError, head_rows
from ascent.doctor.report import CheckResult, fail, ok, skipped, warn
from ascent.models.content import IMAGES_COLUMN, ContentError, resolve_paths

NAME = "images"
FIX_BAD = (
    "fix the image paths (relative paths are relative to the dataset file) or the files; the run leaves "
    "these rows out."
)


def image_rows(path: str) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
    """(rows read, [(row number, row) for the rows of the file's head that show images]), paths resolved."""
    file = Path(path).expanduser()
    if not file.is_file():
        return 0, []
    try:
        rows = head_rows(file, HEAD_ROWS)
    except HeadError:  # the data check reports it
        return 0, []
    out = []
    for i, row in enumerate(rows, start=1):
        if isinstance(row, dict) and row_has_images(row):
            resolve_paths(row, file.resolve().parent)
            out.append((i, row))
    return len(rows), out


def pixel_budget(processor: Any) -> tuple[int | None, int | None]:
    """(min, max) pixels of a Qwen-VL image processor (its `size` edges, or min_pixels/max_pixels)."""
    size = getattr(processor, "size", None) or {}
    get = size.get if hasattr(size, "get") else (lambda _k: None)
    low = get("shortest_edge") or getattr(processor, "min_pixels", None)
    high = get("longest_edge") or getattr(processor, "max_pixels", None)
    return low, high


def check_images(cfg: RunConfig) -> CheckResult:
    """See the module docstring."""
    if cfg.rollout.multi_turn:
        return skipped(NAME, "the environment or agent makes the prompts (their images are not checked here)")
    read, rows = image_rows(cfg.data.train_path)
    from ascent.models.vision import ImageCodecError, image_token_id, load_image_codec  # deferred: torch

    m = cfg.model
    if not m.path or image_token_id(Path(m.path).expanduser()) is None:
        if rows:
            return fail(
                NAME,
                f"data.train_path row {rows[0][0]} shows images, but model.path={m.path!r} is a text-only model",
                "point model.path at a vision-language checkpoint (Qwen2.5-VL, Qwen3-VL), or take the "
                "image parts out of the data.",
            )
        return skipped(NAME, "a text-only model, and no images in the first rows")
    try:
        codec = load_image_codec(Path(m.path).expanduser(), m.min_pixels, m.max_pixels)
    except (ImageCodecError, OSError, ValueError) as err:
        return fail(NAME, f"the image processor does not load ({err})", "check preprocessor_config.json.")
    low, high = pixel_budget(codec.processor)
    where = "model.min_pixels/max_pixels" if m.min_pixels or m.max_pixels else "preprocessor_config.json"
    budget = f"pixel budget {low}..{high} pixels ({where})"
    facts: dict[str, Any] = {"min_pixels": low, "max_pixels": high}
    if not rows:
        return ok(NAME, f"{budget}; no images in the first {read} rows", **facts)
    tokens, per_row, bad = [], [], []
    for row_no, row in rows:
        try:
            _, images = decode_images(row["prompt"], row.get(IMAGES_COLUMN), codec, row_no)
        except BadImageRow as err:
            bad.append(err.problem)
            continue
        except (ContentError, TypeError, KeyError) as err:  # a malformed row: the run's validation names it
            bad.append(f"row {row_no}: {err}")
            continue
        tokens += [im.num_tokens for im in images]
        per_row.append(sum(im.num_tokens for im in images))
    facts |= {"image_tokens": tokens, "bad_rows": bad}
    stats = (
        f"image tokens per image over {len(tokens)} images of the first {read} rows: min {min(tokens)}, "
        f"median {statistics.median(tokens):g}, max {max(tokens)}"
        if tokens
        else "no usable image"
    )
    detail = f"{budget}; {stats}"
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        return warn(
            NAME, f"{detail}; {len(bad)} rows with an unusable image: {bad[0]}{more}", FIX_BAD, **facts
        )
    if per_row and max(per_row) > cfg.data.max_prompt_tokens:
        return warn(
            NAME,
            f"{detail}; a row's images alone are {max(per_row)} tokens, over "
            f"data.max_prompt_tokens={cfg.data.max_prompt_tokens}",
            "lower model.max_pixels (fewer tokens per image) or raise data.max_prompt_tokens.",
            **facts,
        )
    return ok(NAME, detail, **facts)
