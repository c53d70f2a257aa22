"""Questions about an image, with tools that return images (design: "Environments and tools"; Pixel-Reasoner's
zoom-in and frame selection): the environments `zoom_qa` (the tools) and `image_qa` (the same task without
them: one look, one answer).

A row holds the question (`prompt`), the answer (`answer`, or SkyRL's `reward_spec.ground_truth`) and either
`image` (a path, a `data:image/...;base64,` URI or RGB pixels: `ascent.envs.tools.image_tools.load_image`) or
`frames`, a list of such images (an image sequence), or `video`: a video file (a path, absolute or relative
to the dataset file, or a `data:video/...;base64,` URI), a list of frame images, or a dict with that
`video` and its sampling options (`{"video": "clip.mp4", "fps": 1, "max_frames": 8, "max_pixels": 50000}`:
`ascent.envs.video`; default 2 frames per second, at most 16). A video's sampled frames are the sequence,
numbered from 0 and labelled with their time ("frame 2 at 1.5 s"). The first user message shows the image,
or a `preview` of the frames (the row's list of frame indices; default up to 4 evenly spaced), each after a
label, "Image 0 (frame 3):", then the question. Every image the model is shown gets the next number.

Tools, in the model's native `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` format:
- `zoom_in(bbox, image=0)`: the box `[x1, y1, x2, y2]` of shown image `image` (pixels, or fractions of its
  width and height when all four lie in [0, 1]), clamped to the image and upscaled so its longer side is the
  row's `zoom_size` (default: that image's longer side);
- `select_frames(frames)` (rows with `frames` or `video`): those frames at full size (a video's: as decoded),
  at most `max_frames` (the row's, default 4) per call.
Each result is a `tool` message of text and image parts (`ascent.envs.images`); a wrong argument is answered
with the error as text, and the episode goes on. A turn without a tool call is the final answer, scored by
`answer_matches` (the `<answer>` tag, else the whole turn, against the row's answer, normalised exact match).
Each step's `info["tool_calls"]` counts the calls of the turn (malformed ones too).
A relative path in `image`, `frames` or `video` is relative to the dataset file (the data loader resolves it);
an image or video that is missing or unreadable fails the reset with `UnusableRowError`: the run leaves that
row out, naming it, and goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from PIL import Image

from ascent.envs.agent import answer_matches
from ascent.envs.base import Message, StepResult
from ascent.envs.images import image_part, text_part
from ascent.envs.rows import UnusableRowError, row_field, row_messages
from ascent.envs.tools import ToolResult, function_tool, parse_tool_calls
from ascent.envs.tools.image_tools import ImageToolError, load_image, pick_frames, pixel_box, zoom
from ascent.envs.video import VideoError, sampling, video_frames

SYSTEM = (
    "Answer the question about the image. To see a region larger, call the zoom_in tool with its bounding "
    "box [x1, y1, x2, y2] in fractions of the image's width and height (0 to 1) or in pixels, e.g. "
    '<tool_call>{"name": "zoom_in", "arguments": {"bbox": [0, 0, 0.5, 0.5]}}</tool_call>. When you know the '
    "answer, reply with it alone inside <answer></answer>."
)
SYSTEM_NO_TOOLS = "Answer the question about the image with the answer alone inside <answer></answer>."
PREVIEW_FRAMES = 4  # frames a sequence's first message shows, evenly spaced, unless the row says which


class ZoomQa:
    """An image question with `zoom_in` (and `select_frames` for a sequence); see the module docstring.
    `use_tools=False` is `image_qa`: no tools, the first turn is the answer."""

    def __init__(self, use_tools: bool = True) -> None:
        self.use_tools = use_tools
        self.tools: list[dict[str, Any]] | None = None
        # (label, image) pairs the tool call being answered returns, shown after its text
        self._new: list[tuple[str, Image.Image]] = []

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        self.row = row
        self.seen: list[Image.Image] = []  # every image shown, by its number
        self.zoom_size = row_field(row, "zoom_size", None)
        self.max_frames = int(row_field(row, "max_frames", 4))
        self.frames, self.labels = _sequence(row)
        if self.frames:
            preview = row_field(row, "preview", None) or _evenly(len(self.frames), PREVIEW_FRAMES)
            pick_frames(len(self.frames), preview, len(self.frames))  # a bad preview is the row's error
            shown = self._show([(self.labels[i], self.frames[i]) for i in preview])
        else:
            shown = self._show([("the image", load_image(row_field(row, "image")))])
        tools = [function_tool(self.zoom_in)] + ([function_tool(self.select_frames)] if self.frames else [])
        self.by_name = {t.name: t for t in tools} if self.use_tools else {}
        self.tools = [t.schema for t in self.by_name.values()] or None
        *before, question = row_messages(row)
        system = SYSTEM if self.use_tools else SYSTEM_NO_TOOLS
        head = before or [{"role": "system", "content": system}]
        return [*head, {"role": question["role"], "content": [*shown, text_part(question["content"])]}]

    def _show(self, labelled: list[tuple[str, Image.Image]]) -> list[dict[str, Any]]:
        """Content parts showing each (label, image), numbered on from the images shown before."""
        parts: list[dict[str, Any]] = []
        for label, image in labelled:
            parts += [text_part(f"Image {len(self.seen)} ({label}):"), image_part(image)]
            self.seen.append(image)
        return parts

    def step(self, action: str) -> StepResult:
        calls, errors = parse_tool_calls(action) if self.by_name else ([], [])
        if not calls and not errors:
            return StepResult(reward=answer_matches(action, self.row), done=True, info={"tool_calls": 0})
        results = [self._call(c.name, c.arguments) for c in calls]
        results += [{"role": "tool", "content": f"[error] {e}"} for e in errors]
        return StepResult(tuple(results), info={"tool_calls": len(calls) + len(errors)})

    def _call(self, name: str, arguments: dict[str, Any]) -> Message:
        tool = self.by_name.get(name)
        self._new = []
        if tool is None:
            text = f"[error] no tool {name!r}; the tools are {', '.join(sorted(self.by_name))}"
        else:
            text = tool.call(arguments).text()
        return {"role": "tool", "content": [text_part(text), *self._show(self._new)]}

    def zoom_in(self, bbox: list[float], image: int = 0) -> ToolResult:
        """Zoom in: the region bbox [x1, y1, x2, y2] of image `image` (0 is the first image shown), enlarged.
        Coordinates are pixels, or fractions of the width and height when all four are between 0 and 1."""
        if not 0 <= image < len(self.seen):
            return ToolResult(False, "", f"no image {image}; the images shown are 0 to {len(self.seen) - 1}")
        source = self.seen[image]
        try:
            box = pixel_box(bbox, *source.size)
        except ImageToolError as e:
            return ToolResult(False, "", str(e))
        self._new.append((f"zoom of image {image} at {list(box)}", zoom(source, box, self._longest(source))))
        return ToolResult(True, f"Zoomed into {list(box)} of image {image}:")

    def select_frames(self, frames: list[int]) -> ToolResult:
        """Show frames of the sequence at full size, by index (0 is the first frame)."""
        try:
            chosen = pick_frames(len(self.frames), frames, self.max_frames)
        except ImageToolError as e:
            return ToolResult(False, "", str(e))
        self._new += [(self.labels[i], self.frames[i]) for i in chosen]
        return ToolResult(True, f"Frames {', '.join(map(str, chosen))}:")

    def _longest(self, source: Image.Image) -> int:
        return int(self.zoom_size) if self.zoom_size else max(source.size)


def _sequence(row: Mapping[str, Any]) -> tuple[list[Image.Image], list[str]]:
    """(the row's sequence of frames, their labels): its `frames`, or the frames sampled from its `video`
    (numbered by their place in the sequence, with their time); none for a single-image row."""
    frames, video = row_field(row, "frames", None), row_field(row, "video", None)
    if frames is not None and video is not None:
        raise ValueError("the row has both 'frames' and 'video'; give one of them (the sequence to show)")
    if frames is not None:
        labels = [f"frame {i}" for i in range(len(frames))]
        return [load_image(f, f"frames[{i}]") for i, f in enumerate(frames)], labels
    if video is None:
        return [], []
    value, options = video, {}
    if isinstance(video, Mapping):  # {"video": ..., "fps": ...}: the value and its sampling options
        value, options = video.get("video"), {k: v for k, v in video.items() if k != "video"}
    try:
        sampled = video_frames(value, sampling(options), lambda v, i: load_image(v, f"video[{i}]"))
    except VideoError as err:  # a missing or unreadable video, or a bad option: this row's data
        named = isinstance(value, str) and not value.startswith("data:")
        folder = getattr(value, "folder", None)  # a relative path the data loader resolved
        where = f" (resolved against the dataset file's folder {folder})" if folder else ""
        written = getattr(value, "written", value) if named else "(inline)"
        raise UnusableRowError(f"video={written}{where}: {err}") from err
    labels = [f"frame {k}" + ("" if f.time is None else f" at {f.time:.1f} s") for k, f in enumerate(sampled)]
    return [f.image for f in sampled], labels


def _evenly(n: int, k: int) -> list[int]:
    """min(n, k) indices of 0..n-1, evenly spaced, first and last included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def zoom_qa() -> ZoomQa:
    return ZoomQa(use_tools=True)


def image_qa() -> ZoomQa:
    return ZoomQa(use_tools=False)
