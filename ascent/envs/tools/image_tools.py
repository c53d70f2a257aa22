"""Image tools (design: "Environments and tools"): what a vision environment's `zoom_in` and `select_frames`
compute, as pure functions on PIL images, and reading an image a row names.

- `pixel_box(bbox, width, height)`: a model's bounding box `[x1, y1, x2, y2]` -> the pixel box to crop.
  Coordinates are pixels of the image, or fractions of its width and height when all four lie in [0, 1]
  (a pixel box that small would be under one pixel wide). The box is validated (four finite numbers,
  x1 < x2, y1 < y2, overlapping the image), clamped to the image, and grown around its centre to at least
  `MIN_SIDE` pixels a side (a smaller crop shows nothing a patch could see).
- `zoom(image, box, longest)`: the crop, upscaled so its longer side is `longest` pixels (never shrunk).
- `pick_frames(n, indices, limit)`: which frames of an `n`-frame sequence a call selects.
- `load_image(value)`: a PIL image from a path, a `data:image/...;base64,` URI, a PIL image or an RGB array;
  a missing or unreadable file raises `UnusableRowError` (the row's data: the run leaves the row out).

A bad argument raises `ImageToolError` with a sentence for the model (the environment answers with it; the
episode goes on).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ascent.envs.rows import UnusableRowError

MIN_SIDE = 16  # pixels: the smallest crop side zoom_in keeps (a smaller box grows around its centre)


class ImageToolError(ValueError):
    """An image tool's argument the model got wrong; the message is what the model reads."""


def pixel_box(bbox: Sequence[float], width: int, height: int) -> tuple[int, int, int, int]:
    """bbox [x1, y1, x2, y2] (pixels, or fractions when all in [0, 1]) -> (left, top, right, bottom) in
    pixels, inside the width x height image and at least MIN_SIDE (or the image's side) wide and high."""
    if len(bbox) != 4 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in bbox):
        raise ImageToolError(f"bbox must be four finite numbers [x1, y1, x2, y2], got {list(bbox)}")
    x1, y1, x2, y2 = (float(v) for v in bbox)
    if not (x1 < x2 and y1 < y2):
        raise ImageToolError(f"bbox {list(bbox)}: needs x1 < x2 and y1 < y2 (left, top, right, bottom)")
    if all(0.0 <= v <= 1.0 for v in (x1, y1, x2, y2)):  # fractions of the image's width and height
        x1, x2, y1, y2 = x1 * width, x2 * width, y1 * height, y2 * height
    if x2 <= 0 or y2 <= 0 or x1 >= width or y1 >= height:
        raise ImageToolError(f"bbox {list(bbox)} lies outside the image ({width} x {height} pixels)")
    left, right = _span(max(0.0, x1), min(float(width), x2), width)
    top, bottom = _span(max(0.0, y1), min(float(height), y2), height)
    return left, top, right, bottom


def _span(lo: float, hi: float, size: int) -> tuple[int, int]:
    """[lo, hi) inside [0, size) as whole pixels, grown around its centre to min(MIN_SIDE, size)."""
    a, b = int(math.floor(lo)), int(math.ceil(hi))
    need = min(MIN_SIDE, size)
    if b - a < need:
        a = int(round((a + b - need) / 2))
        a = min(max(0, a), size - need)
        b = a + need
    return a, b


def zoom(image: Image.Image, box: tuple[int, int, int, int], longest: int) -> Image.Image:
    """The `box` (left, top, right, bottom) of `image`, upscaled so that its longer side is `longest` pixels
    (bicubic; a crop already that large is returned as cropped)."""
    crop = image.crop(box)
    scale = longest / max(crop.size)
    if scale <= 1.0:
        return crop
    size = (max(1, round(crop.width * scale)), max(1, round(crop.height * scale)))
    return crop.resize(size, Image.Resampling.BICUBIC)


def pick_frames(n: int, indices: Sequence[int], limit: int) -> list[int]:
    """The frames `indices` selects of a sequence of `n` (0 to n-1), repeats dropped, in the order asked;
    at most `limit` of them."""
    if not indices:
        raise ImageToolError(
            f"give the frames to show, e.g. [0, {n - 1}] (the sequence has frames 0 to {n - 1})"
        )
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < n]
    if bad:
        raise ImageToolError(f"no frame {bad[0]}: the sequence has frames 0 to {n - 1}")
    chosen = list(dict.fromkeys(indices))
    if len(chosen) > limit:
        raise ImageToolError(f"{len(chosen)} frames asked; at most {limit} per call")
    return chosen


def load_image(value: Any, field: str = "image") -> Image.Image:
    """An RGB PIL image from `value`: a file path, a `data:image/...;base64,...` URI, a PIL image, or an RGB
    uint8 array [H, W, 3] (or nested lists of one). A path or URI that gives no image (a missing file, bytes
    that are not an image) raises `UnusableRowError` (the run leaves the row out); a value of another kind
    raises ValueError; both name `field` and the fix."""
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, str):
        return _open_image(value, field)
    pixels = np.asarray(value, dtype=np.uint8)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"{field}: expected a path, a data URI or RGB pixels [H, W, 3], got {pixels.shape}")
    return Image.fromarray(pixels)


def _open_image(value: str, field: str) -> Image.Image:
    """The image at path or data URI `value`; raises UnusableRowError naming the path as the row writes it
    (a relative one resolved against the dataset file's folder by the data loader: `ascent.data.loading`)
    and where it was looked for."""
    inline = value.startswith("data:")
    written = getattr(value, "written", value)  # a loader's resolved path knows how the row wrote it
    named = f"{field}={'(data URI)' if inline else repr(written[:200])}"
    if not inline and not Path(value).is_file():
        folder = getattr(value, "folder", None)
        if folder is not None:
            where = f"resolved against the dataset file's folder {folder}: {value}"
        elif not Path(value).is_absolute():
            where = f"relative to the current directory {Path.cwd()}"
        else:
            where = "an absolute path"
        raise UnusableRowError(
            f"{named}: no such image file ({where}); give a path relative to the dataset file, an absolute "
            "path or a data URI (data:image/png;base64,...)"
        )
    try:
        source = io.BytesIO(base64.b64decode(value.partition(",")[2])) if inline else Path(value)
        with Image.open(source) as im:
            return im.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise UnusableRowError(
            f"{named}: not a readable image ({type(err).__name__}: {err}); replace the file or fix the data URI"
        ) from err


def data_uri(image: Image.Image) -> str:
    """`image` as a `data:image/png;base64,...` URI (rows that carry their image inline)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
