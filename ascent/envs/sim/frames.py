"""Frames of simulator episodes for people: one frame as a PNG (an episode's, for the studio), an image strip
(PNG) and a short GIF, and the renderer probe that `ascent doctor` runs.

MuJoCo renders headless through EGL (`MUJOCO_GL=egl`: a GPU's driver, or Mesa's software EGL on a CPU
machine) or OSMesa (`MUJOCO_GL=osmesa`, Debian's libosmesa6). `probe_renderer` tries each in a subprocess
(a broken GL stack can crash or hang the process that loads it) with a timeout, rendering a one-geom scene.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BACKENDS = ("egl", "osmesa")
PROBE = (
    "import mujoco\n"
    "m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom size=\"1\"/></worldbody></mujoco>')\n"
    "r = mujoco.Renderer(m, 16, 16)\n"
    "print(r.render().shape)\n"
)


def pick(frames: Sequence[Any], most: int) -> list[Any]:
    """At most `most` frames, evenly spaced, the first and the last included."""
    if len(frames) <= most:
        return list(frames)
    idx = np.linspace(0, len(frames) - 1, most).round().astype(int)
    return [frames[i] for i in idx]


def save_frame(frame: Any, path: str | Path) -> Path:
    """One frame (RGB uint8 [H, W, 3]) -> a PNG at `path` (its folder made); returns the path."""
    from PIL import Image  # deferred: Pillow, only when frames are saved

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(frame, dtype=np.uint8)).save(out)
    return out


def save_strip(frames: Sequence[Any], path: str | Path, most: int = 12) -> Path:
    """frames (RGB uint8 [H, W, 3] each) -> one PNG of up to `most` of them side by side; returns its path."""
    from PIL import Image  # deferred: Pillow, only when frames are saved

    if not frames:
        raise ValueError("no frames to save: set `render: true` in the row (a simulator that renders)")
    strip = np.concatenate([np.asarray(f, dtype=np.uint8) for f in pick(frames, most)], axis=1)
    Image.fromarray(strip).save(path)
    return Path(path)


def save_gif(frames: Sequence[Any], path: str | Path, most: int = 40, ms_per_frame: int = 100) -> Path:
    """frames -> an animated GIF of up to `most` of them; returns its path."""
    from PIL import Image  # deferred: Pillow, only when frames are saved

    if not frames:
        raise ValueError("no frames to save: set `render: true` in the row (a simulator that renders)")
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in pick(frames, most)]
    images[0].save(path, save_all=True, append_images=images[1:], duration=ms_per_frame, loop=0)
    return Path(path)


def probe_renderer(timeout_s: float = 30.0) -> tuple[str | None, str]:
    """-> (the first MuJoCo GL backend that renders, None if none; what each attempt said)."""
    said = []
    for backend in BACKENDS:
        env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
        try:
            done = subprocess.run(
                [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            said.append(f"{backend}: no answer in {timeout_s:g} s")
            continue
        if done.returncode == 0:
            return backend, f"{backend}: rendered"
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        said.append(f"{backend}: {last[:160]}")
    return None, "; ".join(said)
