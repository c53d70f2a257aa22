"""Rows whose messages show images -> token ids with image pads and the images as the model sees them
(design: "dataset rows -> prompts"; the vision-language side of `ascent.data.prompts` and `ascent.data.sft`).

The messages' content parts (`ascent.models.content`: paths, data URLs, an `images` column of bytes) are
decoded with PIL, rendered by the chat template with one `<|image_pad|>` per image, and each image is
encoded once by the checkpoint's `ImageCodec` (`ascent.models.vision`), whose pixel budget
(`model.min_pixels` / `model.max_pixels`) decides how many pads it becomes; `codec.expand` writes that many.
An image that is missing, unreadable or not an image raises `BadImageRow` naming the row and the image: the
callers drop that row and count it (`RenderReport.bad_images`), never the run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ascent.messages import ImageInput
from ascent.models.content import (
    IMAGES_COLUMN,
    ImageLoadError,
    has_images,
    open_image,
    template_messages,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ascent.models.vision import ImageCodec

log = logging.getLogger("ascent")
MAX_LOGGED = 10  # bad image rows logged one by one; past it, only counted


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
    """(the messages as the chat template reads them, their images encoded in order); raises BadImageRow."""
    template, refs = template_messages(messages, images)
    out = []
    for ref in refs:
        try:
            out.append(codec.encode(open_image(ref), ref.source))
        except ImageLoadError as err:
            raise BadImageRow(f"row {row_no}: image {err.source}: {err.why}") from err
        except ValueError as err:  # the codec's ImageCodecError: pixels it cannot take
            raise BadImageRow(f"row {row_no}: image {ref.source}: {err}") from err
    return template, tuple(out)


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
    return (
        f"row {row_no}: the {what} is {length} tokens, {sum(im.num_tokens for im in images)} of them image "
        f"tokens ({len(images)} images: {counts}), over {field}={max_tokens}; lower model.max_pixels (fewer "
        f"tokens per image) or raise {field}"
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
