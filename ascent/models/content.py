"""Message content with images, written the way the OpenAI API and Hugging Face processors write it: one
parser for dataset rows (`ascent.data`) and the OpenAI endpoint (`ascent.rollout.server`).

A message's `content` is a string or a list of parts:

- `{"type": "text", "text": "..."}`;
- `{"type": "image", "image": X}` (Hugging Face processors) where X is a path, a data URL
  (`data:image/png;base64,...`), raw bytes, or `{"bytes": ..., "path": ...}` (what HF datasets' Image
  feature stores); `{"type": "image"}` with no `image` takes the row's next entry of its `images` column;
- `{"type": "image_url", "image_url": {"url": U}}` (OpenAI), U a data URL or a path (`file://` allowed);
- `{"type": "video", "video": V, "fps": 1.0}` (Hugging Face and Qwen processors) where V is a video file's
  path, a data URL (`data:video/mp4;base64,...`), raw bytes, an HF `{"bytes", "path"}` dict, or a list of
  frame images (each as an image part's `image`); the part's other keys are its sampling options (`fps`,
  `nframes`, `max_frames`, `max_pixels`: `ascent.envs.video`, which also says why a video is shown as its
  frames, each an image).

Paths are absolute, or relative to the dataset file's folder (`resolve_paths`, applied when rows are loaded,
makes them absolute `ResolvedPath`s that remember how the row wrote them, for the "no such file" message).
http(s) URLs are refused: ascent never downloads (download the image and reference it by path).

The `images` column (TRL's and HF datasets' convention): a list whose entries are bytes, `{"bytes": b,
"path": p}` dicts (bytes when present, else the path) or path strings; the k-th `{"type": "image"}` part
without its own `image` shows entry k, and a row has exactly as many such parts as entries.

`template_messages` turns messages into what a chat template reads (each image part becomes
`{"type": "image"}`, each video part `{"type": "video"}`, text-only part lists become one string) plus an
`ImageRef` per image and a `VideoRef` per video, in order; `open_image(ref)` decodes an image with PIL,
raising `ImageLoadError` (naming the image) when it is missing, unreadable or not an image. Videos are
decoded, and their `{"type": "video"}` parts replaced by their frames, where rows become ids
(`ascent.data.images`): this layer cannot reach the decoder. Nothing here imports torch.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from ascent.errors import AscentError
from ascent.models.tool_calls import content_may_be_null, tool_calls_problem

PART_TYPES = ("text", "image", "image_url", "video")
VISUAL_TYPES = ("image", "image_url", "video")  # parts that show the model pixels
IMAGES_COLUMN = "images"
VIDEO_FIELD = "video"  # a video part's value, and the image environment's row field (`ascent.envs.image_env`)
ENV_IMAGE_FIELDS = ("image", "frames")  # the image environment's row fields: an image, a list of frame images
MESSAGE_COLUMNS = ("prompt", "messages")  # row columns that may hold messages with image parts
NO_DOWNLOAD = (
    "ascent never downloads images; download it and reference it by path (absolute, or relative to the "
    "dataset file) or send it inline as a data URL (data:image/png;base64,...)"
)
NO_VIDEO_DOWNLOAD = (
    "ascent never downloads videos; download it and reference it by path (absolute, or relative to the "
    "dataset file) or give its frames as a list of images"
)
VIDEO_PART = "{'type': 'video', 'video': 'clip.mp4'} (a path, a data URL or a list of frame images)"


class ContentError(AscentError, ValueError):
    """A malformed content part (unknown type, missing field, an http(s) URL); names the part and the fix."""


class ImageLoadError(AscentError, ValueError):
    """An image that cannot be opened: missing file, unreadable, not an image. `source` names it."""

    def __init__(self, source: str, why: str) -> None:
        super().__init__(f"{source}: {why}")
        self.source, self.why = source, why


@dataclass(frozen=True)
class ImageRef:
    """One image of a conversation, not yet decoded: `value` (a path, a data URL, bytes or an HF
    `{"bytes", "path"}` dict) and `source`, what errors and `ImageInput.source` call it."""

    value: Any
    source: str


@dataclass(frozen=True)
class VideoRef(ImageRef):
    """One video of a conversation, not yet decoded: `value` (a path, a data URL, bytes, an HF dict or a
    list of frame images) and the part's sampling `options` (`ascent.envs.video.OPTIONS`, as written)."""

    options: Mapping[str, Any] | None = None


def is_remote(url: str) -> bool:
    return url.lower().startswith(("http://", "https://"))


def _part_value(part: Mapping[str, Any]) -> Any:
    """The image a part names (None: `{"type": "image"}` taking the next `images` entry)."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        return url.get("url") if isinstance(url, Mapping) else url
    return part.get("image")


def part_problem(part: object) -> str | None:
    """What is wrong with one content part, or None."""
    if not isinstance(part, Mapping):
        return f"has type {type(part).__name__}; a content part is an object with a 'type'"
    kind = part.get("type")
    if kind not in PART_TYPES:
        return f"has type {kind!r}; use one of {', '.join(PART_TYPES)}"
    if kind == "text":
        return None if isinstance(part.get("text"), str) else "is a text part without a string 'text'"
    if kind == "video":
        return _video_problem(part.get("video"))
    value = _part_value(part)
    if kind == "image_url" and not isinstance(value, str):
        return "is an image_url part without image_url.url; give {'image_url': {'url': 'data:...'}}"
    if isinstance(value, str) and is_remote(value):
        return f"names the URL {value[:80]!r}: {NO_DOWNLOAD}"
    return None


def _video_problem(value: object) -> str | None:
    if value is None:
        return f"is a video part without 'video'; give {VIDEO_PART}"
    if isinstance(value, list) and not value:
        return f"is a video part with an empty list of frames; give {VIDEO_PART}"
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str) and is_remote(v):
            return f"names the URL {v[:80]!r}: {NO_VIDEO_DOWNLOAD}"
    return None


def content_problem(content: object) -> str | None:
    """What is wrong with a message's `content` (a string or a list of parts), or None."""
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        kind = "missing" if content is None else f"of type {type(content).__name__}"
        return f"'content' is {kind}; give a string or a list of content parts"
    for k, part in enumerate(content):
        problem = part_problem(part)
        if problem is not None:
            return f"content part {k} {problem}"
    return None


def message_problem(message: Mapping[str, Any]) -> str | None:
    """What is wrong with a message's `content` and `tool_calls`, or None. The content is a string or a list
    of parts; an assistant message that calls tools (OpenAI's form) may leave it null."""
    content = message.get("content")
    if content is not None or not content_may_be_null(message):
        problem = content_problem(content)
        if problem is not None:
            return problem
    return tool_calls_problem(message)


def has_images(messages: object) -> bool:
    """Whether any message of `messages` (a list of message dicts) holds an image part."""
    if not isinstance(messages, list):
        return False
    return any(
        isinstance(m, Mapping)
        and isinstance(m.get("content"), list)
        and any(isinstance(p, Mapping) and p.get("type") in VISUAL_TYPES for p in m["content"])
        for m in messages
    )


def template_messages(
    messages: Sequence[Mapping[str, Any]], images: Sequence[Any] | None = None
) -> tuple[list[dict[str, Any]], list[ImageRef]]:
    """Messages -> (the dicts a chat template renders, one `ImageRef` per image or `VideoRef` per video, in
    order). `images` is the row's `images` column; raises ContentError for a malformed part or a part/column
    count mismatch."""
    column = list(images or [])
    out: list[dict[str, Any]] = []
    refs: list[ImageRef] = []
    taken = 0
    for i, m in enumerate(messages):
        content = m.get("content")
        problem = content_problem(content) if content is not None else None
        if problem is not None:
            raise ContentError(f"message {i}: {problem}")
        if not isinstance(content, list):
            out.append(dict(m))
            continue
        parts: list[dict[str, Any]] = []
        for k, part in enumerate(content):
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})
                continue
            if part["type"] == "video":
                refs.append(_video_ref(part, f"message {i} part {k}"))
                parts.append({"type": "video"})
                continue
            value = _part_value(part)
            if value is None:
                if taken >= len(column):
                    raise ContentError(
                        f"message {i} content part {k}: an image part without an image, and the "
                        f"'{IMAGES_COLUMN}' column has only {len(column)} entries; give one entry per "
                        "{'type': 'image'} part, or put the image in the part ('image': path or data URL)"
                    )
                value, where = column[taken], f"{IMAGES_COLUMN}[{taken}]"
                taken += 1
            else:
                where = f"message {i} part {k}"
            refs.append(ImageRef(value, _source(value, where)))
            parts.append({"type": "image"})
        text_only = all(p["type"] == "text" for p in parts)
        out.append({**m, "content": "".join(p["text"] for p in parts) if text_only else parts})
    if taken != len(column):
        raise ContentError(
            f"the '{IMAGES_COLUMN}' column has {len(column)} entries but the messages have {taken} "
            "{'type': 'image'} parts without an image; give one entry per such part"
        )
    return out, refs


def _video_ref(part: Mapping[str, Any], where: str) -> VideoRef:
    """A video part -> its `VideoRef`: the keys other than the part's own and other part types' fields
    (present, as None, in Parquet's struct columns) are its options."""
    value = part["video"]
    options = {k: v for k, v in part.items() if k not in ("type", "video", "text", "image", "image_url")}
    source = f"{where} ({len(value)} frames)" if isinstance(value, list) else _source(value, where)
    return VideoRef(value, source, options)


def _source(value: Any, where: str) -> str:
    """How errors name an image: its path when it has one, else where it sits (and what it is)."""
    if isinstance(value, Mapping):
        path = value.get("path")
        if not value.get("bytes") and isinstance(path, str):
            return path
        return f"{where} (bytes of {path})" if isinstance(path, str) and path else f"{where} (bytes)"
    if isinstance(value, str):
        return f"{where} (data URL)" if value.startswith("data:") else value
    return f"{where} (bytes)"


def resolve_paths(row: dict[str, Any], folder: Path) -> None:
    """Relative image and video paths of `row` (in message parts, the `images` column and the image
    environment's `image`, `frames` and `video` fields, also in SkyRL's `extra_info`) -> absolute under
    `folder`, in place."""
    for column in MESSAGE_COLUMNS:
        messages = row.get(column)
        if not isinstance(messages, list):
            continue
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            for part in content if isinstance(content, list) else []:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "image" and isinstance(part.get("image"), str):
                    part["image"] = _absolute(part["image"], folder)
                elif part.get("type") == "video":
                    _resolve_video(part, folder)
                elif part.get("type") == "image_url" and isinstance(part.get("image_url"), dict):
                    url = part["image_url"].get("url")
                    if isinstance(url, str):
                        part["image_url"]["url"] = _absolute(url, folder)
    for holder in (row, row.get("extra_info")):  # SkyRL's rows keep per-row arguments in extra_info
        if isinstance(holder, dict) and holder.get(VIDEO_FIELD) is not None:
            video = holder[VIDEO_FIELD]
            _resolve_video(video if isinstance(video, dict) else holder, folder)
        if isinstance(holder, dict):
            _resolve_env_images(holder, folder)
    entries = row.get(IMAGES_COLUMN)
    if not isinstance(entries, list):
        return
    for k, entry in enumerate(entries):
        if isinstance(entry, str):
            entries[k] = _absolute(entry, folder)
        elif isinstance(entry, dict) and not entry.get("bytes") and isinstance(entry.get("path"), str):
            entry["path"] = _absolute(entry["path"], folder)


def _resolve_video(holder: dict[str, Any], folder: Path) -> None:
    """`holder["video"]` (a path, or a list of frame paths) made absolute under `folder`, in place."""
    value = holder.get(VIDEO_FIELD)
    if isinstance(value, str):
        holder[VIDEO_FIELD] = _absolute(value, folder)
    elif isinstance(value, list):
        holder[VIDEO_FIELD] = [_absolute(v, folder) if isinstance(v, str) else v for v in value]


def _resolve_env_images(holder: dict[str, Any], folder: Path) -> None:
    """`holder["image"]` (a path) and the paths in `holder["frames"]` made absolute under `folder`, in place;
    other values (data URIs, pixels) stay as they are."""
    image, frames = holder.get("image"), holder.get("frames")
    if isinstance(image, str):
        holder["image"] = _absolute(image, folder)
    if isinstance(frames, list):
        holder["frames"] = [_absolute(f, folder) if isinstance(f, str) else f for f in frames]


class ResolvedPath(str):
    """A relative image path made absolute under the dataset file's folder: the absolute path as a `str`,
    still knowing how the row wrote it (`written`) and the folder it was resolved against (`folder`), so an
    image that is not there can be named both ways."""

    written: str
    folder: str

    def __new__(cls, written: str, folder: Path) -> ResolvedPath:
        out = super().__new__(cls, str(folder / Path(written.removeprefix("file://")).expanduser()))
        out.written, out.folder = written, str(folder)
        return out

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (Ray, worker processes) and copies as itself
        return (_rebuild_resolved, (self.written, self.folder))


def _rebuild_resolved(written: str, folder: str) -> ResolvedPath:
    return ResolvedPath(written, Path(folder))


def _absolute(value: str, folder: Path) -> str:
    if value.startswith("data:") or is_remote(value) or isinstance(value, ResolvedPath):
        return value
    path = Path(value.removeprefix("file://")).expanduser()
    return str(path) if path.is_absolute() else ResolvedPath(value, folder)


def missing_file(value: str) -> str:
    """The message for an image path with no file (the caller names the absolute path): for a relative one,
    the path as the row writes it and the folder it was resolved against, with the fix."""
    if isinstance(value, ResolvedPath):
        return (
            f"no such file (the row writes {value.written!r}, resolved against the dataset file's folder "
            f"{value.folder}); give an absolute path or a path relative to that folder"
        )
    return "no such file; give an existing absolute path, or a path relative to the dataset file"


def image_bytes(ref: ImageRef) -> bytes:
    """The encoded bytes of one image (a file's, a data URL's, a bytes column's); raises ImageLoadError."""
    value = ref.value
    if isinstance(value, Mapping):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if not isinstance(value, str) or not value:
        return _fail(ref, f"expected a path, a data URL or bytes, got {type(value).__name__}")
    if is_remote(value):
        return _fail(ref, NO_DOWNLOAD)
    if value.startswith("data:"):
        head, sep, data = value.partition(",")
        if not sep or not head.endswith(";base64"):
            return _fail(ref, "a data URL must be base64: data:image/png;base64,<data>")
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as err:
            return _fail(ref, f"the data URL is not valid base64 ({err})")
    path = Path(value.removeprefix("file://")).expanduser()
    if not path.is_absolute():
        return _fail(
            ref, "a relative path, and no dataset folder to resolve it against; give an absolute path"
        )
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return _fail(ref, missing_file(value))
    except OSError as err:
        return _fail(ref, f"cannot be read ({err.strerror or err})")


def open_image(ref: ImageRef) -> Image.Image:
    """One image decoded with PIL, as RGB; raises ImageLoadError naming it when it cannot be (a video too:
    only data rows decode videos, `ascent.data.images`)."""
    if isinstance(ref, VideoRef):
        return _fail(
            ref, "a video part, and videos are read from dataset rows only; send its frames as images"
        )
    data = image_bytes(ref)
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        return _fail(ref, f"not a readable image ({type(err).__name__}: {err})")


def _fail(ref: ImageRef, why: str) -> Any:
    raise ImageLoadError(ref.source, why)
