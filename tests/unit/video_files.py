"""Tiny video files for tests, written with PyAV (the library ascent decodes with): frame i is one flat
colour whose red channel is `red(i)`, so a test can tell which frames a sampler picked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np


def red(i: int) -> int:
    return (i * 20) % 256


def write_video(
    path: Path, frames: int = 10, rate: int = 5, size: tuple[int, int] = (64, 48), index_first: bool = False
) -> Path:
    """`frames` frames at `rate` per second, width x height `size`; the container follows the suffix
    (.mp4: MPEG-4 part 2, .webm: VP8, whose header does not count its frames). `index_first`: an MP4's
    index (with its frame count) before the frames, so a file cut short still opens and claims them all."""
    codec = "libvpx" if path.suffix == ".webm" else "mpeg4"
    width, height = size
    options = {"movflags": "faststart"} if index_first else {}
    with av.open(str(path), "w", options=options) as container:
        stream: Any = container.add_stream(codec, rate=rate)  # a VideoStream for a video codec
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            pixels = np.zeros((height, width, 3), np.uint8)
            pixels[..., 0], pixels[..., 1] = red(i), 100
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


def frame_red(image: Any) -> int:
    """The mean red value of a decoded frame (lossy coding moves it by a few levels)."""
    return int(round(float(np.asarray(image)[..., 0].mean())))
