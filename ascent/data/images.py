"""Rows whose messages show images -> token ids with image pads and the images as the model sees them
(design: "dataset rows -> prompts"; the vision-language side of `ascent.data.prompts` and `ascent.data.sft`).

The messages' content parts (`ascent.models.content`: paths, data URLs, an `images` column of bytes) are
decoded with PIL, rendered by the chat template with one `<|image_pad|>` per image, and each image is
encoded once by the checkpoint's `ImageCodec` (`ascent.models.vision`), whose pixel budget
(`model.min_pixels` / `model.max_pixels`) decides how many pads it becomes; `codec.expand` writes that many.
An image that is missing, unreadable or not an image raises `BadImageRow` naming the row and the image: the
callers drop that row and count it (`RenderReport.bad_images`), never the run.

A video part (`{"type": "video", "video": "clip.mp4", "fps": 1}`) is decoded here into its sampled frames
(`ascent.envs.video`, which says why frames and not video tokens) and becomes, in the template, each
frame's marker text ("Frame 3 at 1.5 s:") and image part: from then on its frames are images like any
other, named `<video> frame 3 at 1.5 s` (`frame_of` and `video_frames_of` find them again for reports). A video that is
missing, unreadable or has a bad option costs its row the same way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ascent.envs.video import Frame, VideoError, sampling, video_frames
from ascent.messages import ImageInput
from ascent.models.content import (
    IMAGES_COLUMN,
    ImageLoadError,
    ImageRef,
    VideoRef,
    has_images,
    image_bytes,
    missing_file,
    open_image,
    template_messages,
)
from ascent.models.tool_calls import with_template_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ascent.models.vision import ImageCodec

log = logging.getLogger("ascent")
MAX_LOGGED = 10  # bad image rows logged one by one; past it, only counted
FRAME_NAME = re.compile(r"^(.*) frame \d+(?: at [\d.]+ s)?$")  # a video frame's ImageInput.source


class BadImageRow(Exception):
    """One row's image could not be used; `problem` reads `row N: image <path>: <why>`."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def row_has_images(row: dict[str, Any], column: str = "prompt") -> bool:
    """Whether the row's messages in `column` show an image (or it has an `images` column)."""
    return has_images(row.get(column)) or bool(row.get(IMAGES_COLUMN))


def text_model_problem(row_no: int) -> str:
    return (
        f"row {row_no}: the messages show images, but model.path is a text-only model (no image_token_id "
        "in config.json or no preprocessor_config.json); point model.path at a vision-language checkpoint "
        "(Qwen2.5-VL, Qwen3-VL) or take the image parts out of the data."
    )


def decode_images(
    messages: Sequence[dict[str, Any]], images: Sequence[Any] | None, codec: ImageCodec, row_no: int
) -> tuple[list[dict[str, Any]], tuple[ImageInput, ...]]:
    """(the messages as the chat template reads them, their images encoded in order: a video's sampled
    frames in its place; assistants' OpenAI tool calls in template form); raises BadImageRow."""
    template, refs = template_messages(with_template_calls(messages), images)
    out = []
    shown: list[list[Frame]] = []  # each video's frames, in order
    for ref in refs:
        if isinstance(ref, VideoRef):
            shown.append(_frames(ref, row_no))
            out += [_encode(codec, f.image, f"{ref.source} {f.label}", row_no) for f in shown[-1]]
            continue
        try:
            image = open_image(ref)
        except ImageLoadError as err:
            raise BadImageRow(f"row {row_no}: image {err.source}: {err.why}") from err
        out.append(_encode(codec, image, ref.source, row_no))
    return (_with_frames(template, shown) if shown else template), tuple(out)


def _encode(codec: ImageCodec, image: Any, source: str, row_no: int) -> ImageInput:
    try:
        return codec.encode(image, source)
    except ValueError as err:  # the codec's ImageCodecError: pixels it cannot take
        raise BadImageRow(f"row {row_no}: image {source}: {err}") from err


def _frames(ref: VideoRef, row_no: int) -> list[Frame]:
    """A video part's sampled frames; raises BadImageRow naming the row, the video and the fix."""

    def open_frame(value: Any, index: int) -> Any:
        named = isinstance(value, str) and not value.startswith("data:")
        return open_image(ImageRef(value, value if named else f"{ref.source} frame {index}"))

    value = ref.value
    try:
        if isinstance(value, dict):  # HF datasets' {"bytes", "path"}: bytes when present, else the path
            value = image_bytes(ref) if value.get("bytes") else value.get("path")
        if isinstance(value, str) and not value.startswith("data:"):
            _check_path(value)
        return video_frames(value, sampling(ref.options or {}), open_frame)
    except ImageLoadError as err:
        raise BadImageRow(f"row {row_no}: image {err.source}: {err.why}") from err
    except VideoError as err:
        raise BadImageRow(f"row {row_no}: video {ref.source}: {err}") from err


def _check_path(value: str) -> None:
    """Raise VideoError for a video path that names no file (with the fix)."""
    path = Path(value.removeprefix("file://")).expanduser()
    if not path.is_absolute():
        raise VideoError(
            "a relative path, and no dataset folder to resolve it against; give an absolute path"
        )
    if not path.is_file():
        raise VideoError(missing_file(value))


def _with_frames(template: list[dict[str, Any]], shown: list[list[Frame]]) -> list[dict[str, Any]]:
    """`template` with its k-th `{"type": "video"}` part replaced by video k's frames: for each, its marker
    text and an image part."""
    videos = iter(shown)
    out = []
    for m in template:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(m)
            continue
        parts: list[dict[str, Any]] = []
        for part in content:
            if part.get("type") != "video":
                parts.append(part)
                continue
            for frame in next(videos):
                parts += [{"type": "text", "text": f"{frame.label.capitalize()}:"}, {"type": "image"}]
        out.append({**m, "content": parts})
    return out


def frame_of(image: ImageInput) -> str | None:
    """The video `image` is a frame of (its source reads `<video> frame N ...`), or None."""
    match = FRAME_NAME.match(image.source)
    return match.group(1) if match else None


def video_frames_of(images: Sequence[ImageInput]) -> dict[str, int]:
    """{video: frames shown} for the images that are a video's frames."""
    counts: dict[str, int] = {}
    for video in filter(None, map(frame_of, images)):
        counts[video] = counts.get(video, 0) + 1
    return counts


def expand(ids: Sequence[int], images: Sequence[ImageInput], codec: ImageCodec, row_no: int) -> list[int]:
    """`codec.expand` (one pad per image -> num_tokens pads each); a count mismatch (the text itself writes
    an image pad) costs the row."""
    try:
        return codec.expand(ids, images)
    except ValueError as err:
        raise BadImageRow(f"row {row_no}: {err} (does the text hold the image token itself?)") from err


def image_prompt(
    row: dict[str, Any], tokenizer: PreTrainedTokenizerBase, codec: ImageCodec, row_no: int
) -> tuple[list[int], str, tuple[ImageInput, ...]]:
    """A row whose `prompt` messages show images -> (ids with image pads, rendered text, images)."""
    messages, images = decode_images(row["prompt"], row.get(IMAGES_COLUMN), codec, row_no)
    text = str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return expand(ids, images, codec, row_no), text, images


def overlong_image_problem(
    row_no: int, length: int, images: Sequence[ImageInput], max_tokens: int, field: str, what: str = "prompt"
) -> str:
    """`row N: ...` for a row whose text and image tokens are over `field`=max_tokens: it is left out (a cut
    would split an image), and the fix is fewer tokens per image or a larger limit."""
    counts = ", ".join(str(im.num_tokens) for im in images)
    frames = sum(video_frames_of(images).values())
    fewer = (
        f", show fewer video frames ({frames} now: the video part's max_frames, nframes or fps) or smaller "
        "ones (its max_pixels)"
        if frames
        else ""
    )
    return (
        f"row {row_no}: the {what} is {length} tokens, {sum(im.num_tokens for im in images)} of them image "
        f"tokens ({len(images)} images: {counts}), over {field}={max_tokens}; lower model.max_pixels (fewer "
        f"tokens per image){fewer} or raise {field}"
    )


def log_bad_row(source: str, problem: str, count: int) -> None:
    """Warn about the `count`-th bad image row (the first MAX_LOGGED one by one)."""
    if count <= MAX_LOGGED:
        log.warning("%s %s; the row is left out", source, problem)
    elif count == MAX_LOGGED + 1:
        log.warning("%s: more rows with unusable images; they are counted, not logged", source)


def expand_turns(
    prompt: Sequence[int],
    response: Sequence[int],
    mask: Sequence[int],
    images: Sequence[ImageInput],
    codec: ImageCodec,
    row_no: int,
) -> tuple[list[int], list[int], list[int]]:
    """A conversation's (prompt ids, response ids, loss mask) with one pad per image -> each image's
    num_tokens pads; a pad in the response (a tool result's image) keeps its turn's mask (0)."""
    pad = codec.image_token_id
    first = sum(1 for t in prompt if t == pad)
    pads = first + sum(1 for t in response if t == pad)
    if pads != len(images):
        raise BadImageRow(
            f"row {row_no}: the conversation renders {pads} image placeholders for {len(images)} images "
            "(does the text hold the image token itself?)"
        )
    ids, out_mask, k = [], [], first
    for t, m in zip(response, mask, strict=True):
        n = 1
        if t == pad:
            n, k = images[k].num_tokens, k + 1
        ids += [t] * n
        out_mask += [m] * n
    return expand(prompt, images[:first], codec, row_no), ids, out_mask
