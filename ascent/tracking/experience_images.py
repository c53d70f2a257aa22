"""The images of vision-language episodes in the experience store (`ascent.tracking.experience_store`), so a
stored episode replays (`ascent.orchestrator.replay`) with the very images its tokens stand for.

Two tables beside `episodes`, created with it (`IMAGES_SCHEMA`; a store written before them simply has no
images): `images` holds each distinct image once, keyed by its `ImageInput.digest` (the samples of a group
share their prompt's image: stored once), as the processor's patches (`pixels`: the array's raw bytes in
native byte order, with `dtype` and `shape`), its grid, token count and source; `episode_images` lists an
episode's images in order (`position`, as `Episode.images`). bfloat16 patches are stored as float32.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import numpy as np

from ascent.messages import ImageInput

IMAGES_SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    digest TEXT PRIMARY KEY,         -- ImageInput.digest: one row per distinct image
    grid TEXT NOT NULL,              -- JSON [frames, rows, columns] of patches
    num_tokens INTEGER NOT NULL,     -- image-pad tokens standing for it
    source TEXT NOT NULL,            -- where it came from (a path, `row 3 part 1`, `turn 2: zoom_in`)
    dtype TEXT NOT NULL,             -- numpy dtype of the patches
    shape TEXT NOT NULL,             -- JSON shape of the patches
    pixels BLOB NOT NULL             -- the patches' raw bytes
);
CREATE TABLE IF NOT EXISTS episode_images (
    episode_id INTEGER NOT NULL,     -- episodes.id
    position INTEGER NOT NULL,       -- its place in Episode.images
    digest TEXT NOT NULL,            -- images.digest
    PRIMARY KEY (episode_id, position)
);
"""


def _array(pixel_values: Any) -> np.ndarray:
    """A torch tensor or numpy array of patches -> a contiguous numpy array (bfloat16 -> float32)."""
    if hasattr(pixel_values, "detach"):  # a torch tensor (tracking needs no torch import for it)
        t = pixel_values.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return np.ascontiguousarray(t.numpy())
    return np.ascontiguousarray(np.asarray(pixel_values))


def write_images(conn: sqlite3.Connection, episode_id: int, images: Sequence[ImageInput]) -> None:
    """Store `images` as episode `episode_id`'s, each distinct image once (in the caller's transaction)."""
    for position, image in enumerate(images):
        known = conn.execute("SELECT 1 FROM images WHERE digest = ?", (image.digest,)).fetchone()
        if known is None:
            arr = _array(image.pixel_values)
            conn.execute(
                "INSERT INTO images VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    image.digest,
                    json.dumps(list(image.grid_thw)),
                    image.num_tokens,
                    image.source,
                    arr.dtype.str,
                    json.dumps(list(arr.shape)),
                    arr.tobytes(),
                ),
            )
        conn.execute("INSERT INTO episode_images VALUES (?, ?, ?)", (episode_id, position, image.digest))


def read_images(conn: sqlite3.Connection, episode_id: int) -> tuple[ImageInput, ...]:
    """Episode `episode_id`'s images, in order (none in a store written before images were stored)."""
    try:
        rows = conn.execute(
            "SELECT i.digest, i.grid, i.num_tokens, i.source, i.dtype, i.shape, i.pixels FROM episode_images e "
            "JOIN images i ON i.digest = e.digest WHERE e.episode_id = ? ORDER BY e.position",
            (episode_id,),
        ).fetchall()
    except sqlite3.OperationalError:  # no such table: an older store
        return ()
    out = []
    for digest, grid, num_tokens, source, dtype, shape, pixels in rows:
        arr = np.frombuffer(pixels, dtype=np.dtype(dtype)).reshape(json.loads(shape)).copy()
        t, h, w = json.loads(grid)
        out.append(ImageInput(arr, (t, h, w), num_tokens, digest, source))
    return tuple(out)
