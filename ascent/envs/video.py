"""Videos as sequences of frames (design: "Environments and tools": observations are text, images or state
vectors): decoding a video file into a few sampled frames, for dataset rows (`ascent.data.images`) and the
image environment's `video` rows (`ascent.envs.image_env`).

Representation: a video is shown to the model as the frames sampled from it, each an ordinary image (its
own image tokens) after a text marker, "Frame 3 at 1.5 s:". Every path that shows images already takes
that: data rows, SFT conversations, the environments' messages, the engines (fast and reference), the
trainer's packing and logprobs, the experience store and replay. It needs nothing new downstream, so a
video row behaves exactly like a row of images, pixel budget and image-token counts included. The marker
gives back the time axis that separate images lose. Qwen's native video tokens (`<|video_pad|>`, two frames
per temporal patch, a time axis in the multimodal rotary positions) would need the fast engine's vision
path, the trainer's positions and the processors changed together; they are not done.

Sampling, under the option names Qwen's processor (qwen-vl-utils) reads from a video content part:
- `fps` (default `DEFAULT_FPS`): frames per second of video, so a clip of d seconds gives round(d * fps)
  frames, at least one and at most `max_frames`;
- `nframes`: exactly that many frames (fewer if the clip is shorter), instead of `fps`;
- `max_frames` (default `DEFAULT_MAX_FRAMES` with `fps`): the most frames, whatever the clip's length;
- `max_pixels`: each frame shrunk (aspect kept) to at most that many pixels before the model's own pixel
  budget (`model.max_pixels`) applies; fewer pixels per frame, fewer image tokens per frame.
Frames are spread evenly over the clip, first and last included (as Qwen's `linspace` does). A video given
as a list of frame images (as Hugging Face chat templates accept) is sampled the same way by `nframes` /
`max_frames`; it has no clock, so `fps` is refused there and its markers carry no time.

Decoding uses PyAV (`av`: FFmpeg's libraries, bundled in its wheels for Linux x86_64 and aarch64, macOS
and Windows; no system ffmpeg). A file that is missing, unreadable or holds no video stream raises
`VideoError` with the reason; the caller names the row and the path.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from ascent.errors import AscentError

DEFAULT_FPS = 2.0  # Qwen2.5-VL's processor samples 2 frames per second by default
DEFAULT_MAX_FRAMES = 16  # each frame is a whole image's tokens: keep a default clip affordable
OPTIONS = ("fps", "nframes", "max_frames", "max_pixels")


class VideoError(AscentError, ValueError):
    """A video that cannot be used (missing, unreadable, no video stream) or a bad sampling option; the
    message says why and the fix, the caller says which row and which video."""


@dataclass(frozen=True)
class VideoSampling:
    """How many frames to take of a video and how large (see the module docstring)."""

    fps: float | None = None
    nframes: int | None = None
    max_frames: int | None = None
    max_pixels: int | None = None

    @property
    def frame_limit(self) -> int | None:
        """The most frames: `max_frames`, else the default unless `nframes` says how many."""
        if self.max_frames is not None:
            return self.max_frames
        return None if self.nframes is not None else DEFAULT_MAX_FRAMES


@dataclass(frozen=True)
class Frame:
    """One sampled frame: the picture, its index in the clip and its time in seconds (None: no clock)."""

    image: Image.Image
    index: int
    time: float | None

    @property
    def label(self) -> str:
        """ "frame 3 at 1.5 s" (or "frame 3" without a clock): the marker's words and the frame's name."""
        return f"frame {self.index}" + ("" if self.time is None else f" at {self.time:.1f} s")


def sampling(options: Mapping[str, Any]) -> VideoSampling:
    """A video part's options (`OPTIONS`; None values are absent) -> `VideoSampling`; raises VideoError
    naming the option, its value and the fix."""
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise VideoError(f"unknown video option {unknown[0]!r}; the options are {', '.join(OPTIONS)}")
    if "fps" in given and "nframes" in given:
        raise VideoError(
            f"fps={given['fps']} and nframes={given['nframes']} both set; give one (fps: frames per second "
            "of video, nframes: how many frames)"
        )
    for name, value in given.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        whole = name != "fps"
        if not number or value <= 0 or (whole and int(value) != value):
            kind = "a positive number" if name == "fps" else "a positive whole number"
            raise VideoError(f"{name}={value!r}: give {kind}")
    fps, nframes, limit, pixels = (given.get(k) for k in OPTIONS)
    return VideoSampling(
        fps=None if fps is None else float(fps),
        nframes=None if nframes is None else int(nframes),
        max_frames=None if limit is None else int(limit),
        max_pixels=None if pixels is None else int(pixels),
    )


def frame_indices(total: int, rate: float | None, s: VideoSampling) -> list[int]:
    """Which of a clip's `total` frames (`rate` frames per second; None: no clock) to show, in order:
    `s.nframes`, or its length times `s.fps` (default DEFAULT_FPS), capped by `s.frame_limit`, evenly
    spread with the first and last frames included."""
    if total <= 0:
        return []
    if s.nframes is not None:
        n = s.nframes
    elif rate:
        n = max(1, round(total / rate * (s.fps or DEFAULT_FPS)))
    else:
        n = total
    limit = s.frame_limit
    n = min(n, total, limit if limit is not None else n)
    if n == 1:
        return [0]
    return sorted({round(i * (total - 1) / (n - 1)) for i in range(n)})


def fit_pixels(image: Image.Image, max_pixels: int | None) -> Image.Image:
    """`image` shrunk (aspect kept, bicubic) to at most `max_pixels` pixels; as it is when within."""
    w, h = image.size
    if max_pixels is None or w * h <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (w * h))
    size = (max(1, math.floor(w * scale)), max(1, math.floor(h * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)


def sequence_indices(count: int, s: VideoSampling) -> list[int]:
    """Which of a list of `count` frame images to show (no clock: `fps` is refused with the fix)."""
    if s.fps is not None:
        raise VideoError(
            f"fps={s.fps} for a list of frame images, which has no clock; sample it with nframes or max_frames"
        )
    if count == 0:
        raise VideoError("an empty list of frames; give at least one frame image")
    return frame_indices(count, None, s)


VideoValue = str | Path | bytes | bytearray | memoryview | Sequence[object]
"""What a video part's `video` holds: a path, a data URL, the file's bytes, or a list of frame images."""


def video_frames(
    value: VideoValue | None, s: VideoSampling, load_frame: Callable[[Any, int], Image.Image]
) -> list[Frame]:
    """The sampled frames of `value`: a video file's path, a `data:video/...;base64,` URL, the file's bytes,
    or a list of frame images (each opened by `load_frame(entry, index)`, which raises for a bad one)."""
    if isinstance(value, (list, tuple)):
        chosen = sequence_indices(len(value), s)
        return [Frame(fit_pixels(load_frame(value[i], i), s.max_pixels), i, None) for i in chosen]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return read_video(bytes(value), s)
    if not isinstance(value, (str, Path)) or not str(value):
        raise VideoError(
            f"expected a path, a data URL, bytes or a list of frame images, got {type(value).__name__}"
        )
    text = str(value)
    if text.startswith("data:"):
        head, sep, data = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise VideoError("a data URL must be base64: data:video/mp4;base64,<data>")
        try:
            payload = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as err:
            raise VideoError(f"the data URL is not valid base64 ({err})") from err
        return read_video(payload, s)
    return read_video(Path(text.removeprefix("file://")).expanduser(), s)


def read_video(source: str | Path | bytes, s: VideoSampling) -> list[Frame]:
    """The frames of the video file at `source` (a path, or the file's bytes) that `s` samples, as RGB
    images within `s.max_pixels`; raises VideoError when it cannot be read. A file's frames are kept for
    the next rows that ask for the same file (unchanged) with the same options."""
    if isinstance(source, bytes):
        return list(_read(source, s))
    try:
        stat = Path(source).stat()
    except OSError:
        return list(_read(source, s))  # _open says why
    return list(_read_file(str(source), stat.st_mtime_ns, stat.st_size, s))


@functools.lru_cache(maxsize=8)  # several questions about one clip decode it once
def _read_file(path: str, mtime_ns: int, size: int, s: VideoSampling) -> tuple[Frame, ...]:
    return _read(path, s)


def _read(source: str | Path | bytes, s: VideoSampling) -> tuple[Frame, ...]:
    total, rate = _probe(source)
    wanted = frame_indices(total, rate, s)
    frames, decoded = _decode(source, wanted, rate, s.max_pixels)
    if len(frames) < len(wanted):  # the header counts frames the stream does not hold (or a corrupt tail)
        frames, _ = _decode(source, frame_indices(decoded, rate, s), rate, s.max_pixels)
    if not frames:
        raise VideoError("the video stream holds no frame that decodes; re-encode the file")
    return tuple(frames)


def _av() -> Any:
    """PyAV, imported on the first video (deferred on purpose: it loads FFmpeg's libraries, which a run
    without videos never needs, and machines that never see a video need not carry it)."""
    import av

    return av


def _open(source: str | Path | bytes) -> Any:
    av = _av()
    try:
        return av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source))
    except FileNotFoundError as err:
        raise VideoError(
            "no such file; give an existing path (absolute, or relative to the dataset file)"
        ) from err
    except (av.FFmpegError, OSError, ValueError) as err:
        raise VideoError(
            f"not a readable video ({_why(err)}); give a video file (mp4, webm, mkv, ...)"
        ) from err


def _probe(source: str | Path | bytes) -> tuple[int, float | None]:
    """(frames in the first video stream, frames per second or None); counts packets when the header does
    not say (WebM)."""
    with _open(source) as container:
        if not container.streams.video:
            raise VideoError("the file holds no video stream; give a video file (mp4, webm, mkv, avi, ...)")
        stream = container.streams.video[0]
        av = _av()
        rate = stream.average_rate or stream.guessed_rate
        total = int(stream.frames or 0)
        if total <= 0:
            try:
                total = sum(1 for p in container.demux(stream) if p.size)
            except (av.FFmpegError, ValueError) as err:
                raise VideoError(
                    f"the video stream cannot be read ({_why(err)}); re-encode the file"
                ) from err
        return total, (float(rate) if rate else None)


def _decode(
    source: str | Path | bytes, wanted: Sequence[int], rate: float | None, pixels: int | None
) -> tuple[list[Frame], int]:
    """(the frames numbered `wanted` (ascending), frames decoded), in one pass; a corrupt tail ends the
    pass early."""
    av = _av()
    keep = set(wanted)
    out: list[Frame] = []
    decoded = 0
    if not keep:
        return out, decoded
    with _open(source) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for index, frame in enumerate(container.decode(stream)):
                decoded = index + 1
                if index in keep:
                    image = fit_pixels(frame.to_image().convert("RGB"), pixels)
                    out.append(Frame(image, index, index / rate if rate else frame.time))
                if index >= wanted[-1]:
                    break
        except (av.FFmpegError, ValueError) as err:
            if not out:
                raise VideoError(
                    f"the video stream does not decode ({_why(err)}); re-encode the file"
                ) from err
    return out, decoded


def _why(err: Exception) -> str:
    """FFmpeg's reason without the '<none>' file name PyAV appends for in-memory input."""
    return str(getattr(err, "strerror", None) or err)
