"""Images in multi-turn episodes: an environment's messages may carry pictures, the runner turns them into
image tokens (design: "Episodes and the collector": observations are text, images or state vectors).

An environment puts an image into a message as an OpenAI/Hugging Face-style content part,
`{"type": "image", "image": <PIL image or RGB uint8 array [H, W, 3]>}` (`image_part`), beside
`{"type": "text", "text": ...}` parts; `content` is then a list of parts instead of a string. The
environment hands over pixels, never tokens: it imports nothing of the models (design: envs import only
messages and errors).

Encoding happens where the runner builds tokens, through an `ImageEncoder` the caller passes in (the
model's `ascent.models.vision.ImageCodec` satisfies it; the orchestrator loads it from the checkpoint). The
chat template renders one `<|image_pad|>` per image part (`split_images` leaves a bare `{"type": "image"}`
for it), the encoder expands each to the image's token count, and the `ImageInput`s travel beside the ids in
the order of their placeholder runs (`render_with_images`). Only the ids of the new messages are rendered
and expanded: the history is never re-tokenised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ascent.envs.rows import UnusableRowError
from ascent.errors import AscentError
from ascent.messages import ImageInput


class ImageEncoder(Protocol):
    """Pixels -> `ImageInput`, and a template's single placeholders -> runs of the image's token count."""

    @property
    def image_token_id(self) -> int: ...

    def encode(self, image: Any, source: str = "") -> ImageInput:
        """One PIL image or RGB uint8 array [H, W, 3] -> its `ImageInput`."""
        ...

    def expand(self, ids: Sequence[int], images: Sequence[ImageInput]) -> list[int]:
        """`ids` with its k-th image placeholder repeated `images[k].num_tokens` times."""
        ...


class ImagesWithoutEncoderError(AscentError, ValueError):
    """Messages carry images but the model reads no images (no encoder: a text-only checkpoint)."""


def image_part(image: Any) -> dict[str, Any]:
    """The content part that shows `image` (a PIL image or an RGB uint8 array [H, W, 3]) to the model."""
    return {"type": "image", "image": image}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def split_images(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """messages -> (the same messages with every image part reduced to `{"type": "image"}`, the images in
    the order the template writes their placeholders). Messages whose content is a string are kept."""
    plain: list[dict[str, Any]] = []
    images: list[Any] = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, (list, tuple)):
            plain.append(dict(m))
            continue
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "image" and "image" in part:
                images.append(part["image"])
                parts.append({"type": "image"})
            else:
                parts.append(dict(part) if isinstance(part, Mapping) else part)
        plain.append({**m, "content": parts})
    return plain, images


def render_with_images(
    render: Callable[[list[dict[str, Any]]], list[int]],
    messages: Sequence[Mapping[str, Any]],
    encoder: ImageEncoder | None,
    source: str,
) -> tuple[list[int], list[ImageInput]]:
    """`render(messages)` (a chat template's ids) with each image placeholder expanded to its image's token
    count, and the images encoded, in order (`source`: where they came from, e.g. "row 3 turn 2"; image k is
    named `<source> image k`). Messages without images render exactly as `render` does."""
    plain, pictures = split_images(messages)
    ids = render(plain)
    if not pictures:
        return ids, []
    if encoder is None:
        raise ImagesWithoutEncoderError(
            f"{source}: the messages hold {len(pictures)} image(s) but the model reads no images; use a "
            "vision-language checkpoint (model.path with an image processor) or an environment without images."
        )
    images = [_encode(encoder, p, f"{source} image {k}") for k, p in enumerate(pictures)]
    return encoder.expand(ids, images), images


def _encode(encoder: ImageEncoder, picture: Any, name: str) -> ImageInput:
    """`encoder.encode`; pixels it refuses (its ValueError) are the row's data: `UnusableRowError`."""
    try:
        return encoder.encode(picture, name)
    except ValueError as err:
        raise UnusableRowError(f"{name}: the model's image processor refuses it ({err})") from err
