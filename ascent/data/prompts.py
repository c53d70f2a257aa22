"""Render validated rows into prompt token ids (design: "dataset rows -> prompts").

A message-list prompt always goes through the tokenizer's chat template with the generation prompt appended;
a string prompt goes through it as one user message (or is encoded raw with `chat_template=False`). Rendered
text is encoded without adding special tokens: the template already holds them. Rows that carry
`prompt_ids` skip rendering. Prompts longer than `max_prompt_tokens` are dropped, truncated or rejected, and
the `RenderReport` always counts what happened: nothing is cut silently.

Messages that show images (content parts, `ascent.models.content`) need the model's `ImageCodec`: their ids
hold each image's pads and the item carries the images (`ascent.data.images`). A row whose image is missing
or unreadable is left out and counted (`RenderReport.bad_images`); an overlong image prompt is left out
(logged with its row number, its image tokens and the fix: `model.max_pixels` or the limit), never truncated
(a cut would split an image's pads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ascent.data.images import (
    BadImageRow,
    image_prompt,
    log_bad_row,
    overlong_image_problem,
    row_has_images,
    text_model_problem,
)
from ascent.data.validation import DataError, raise_problems
from ascent.messages import ImageInput
from ascent.models.content import template_messages
from ascent.models.tool_calls import with_template_calls

if TYPE_CHECKING:
    from ascent.models.vision import ImageCodec

if TYPE_CHECKING:  # transformers is imported where the tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

Overlong = Literal["drop", "truncate", "error"]
Side = Literal["left", "right"]
PROMPT_FIELDS = ("prompt", "prompt_ids", "images")


@dataclass
class PromptItem:
    """One renderable prompt: its row index (0-based), token ids, rendered text, the row's other fields and
    the images its ids show (one per image-pad run, in order)."""

    row_id: int
    prompt_ids: list[int]
    prompt_text: str
    metadata: dict[str, Any]
    images: tuple[ImageInput, ...] = ()


@dataclass
class RenderReport:
    """What the length policy did; `summary()` is the line the caller logs."""

    total: int = 0
    dropped: int = 0
    truncated: int = 0
    longest: int = 0
    max_tokens: int = 0
    dropped_row_ids: list[int] = field(default_factory=list)
    bad_images: list[str] = field(default_factory=list)  # "row N: image <path>: <why>", one per row left out
    overlong_images: list[str] = field(default_factory=list)  # rows with images over the limit, left out
    image_tokens: list[int] = field(default_factory=list)  # image tokens of every image kept, in order

    @property
    def kept(self) -> int:
        return self.total - self.dropped

    def __str__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        bad, tokens = len(self.bad_images), self.image_tokens
        return (
            f"{self.kept}/{self.total} prompts kept; {self.dropped - bad} dropped and {self.truncated} "
            f"truncated over {self.max_tokens} tokens (longest: {self.longest})"
            + (f"; {len(tokens)} images of {min(tokens)}..{max(tokens)} image tokens" if tokens else "")
            + (f"; {bad} left out for an unusable image (first: {self.bad_images[0]})" if bad else "")
            + (
                f"; {len(self.overlong_images)} with images over the limit (first: {self.overlong_images[0]})"
                if self.overlong_images
                else ""
            )
        )

    def drop_bad_image(self, row_id: int, err: BadImageRow, source: str) -> None:
        """Count (and log) row `row_id`, left out for an image it cannot show."""
        self.dropped += 1
        self.dropped_row_ids.append(row_id)
        self.bad_images.append(err.problem)
        log_bad_row(source, err.problem, len(self.bad_images))

    def drop_overlong_images(self, row_id: int, problem: str, source: str) -> None:
        """Count (and log) row `row_id`, left out for images that take it over the length limit."""
        self.dropped += 1
        self.dropped_row_ids.append(row_id)
        self.overlong_images.append(problem)
        log_bad_row(source, problem, len(self.bad_images) + len(self.overlong_images))

    def no_rows_left(self, source: str, num_rows: int) -> DataError:
        """The error when every row was left out: over the length limit or with an unusable image."""
        if self.bad_images and len(self.bad_images) == num_rows:
            return DataError(
                f"{source}: all {num_rows} rows were left out for an unusable image or video (first: "
                f"{self.bad_images[0]}); fix the paths (relative to the dataset file), the files or the "
                "video options."
            )
        return DataError(
            f"{source}: no usable prompts: {self.summary()}; raise data.max_prompt_tokens, lower "
            "model.max_pixels or fix the images."
            if self.bad_images or self.overlong_images
            else f"{source}: all {num_rows} prompts are over data.max_prompt_tokens={self.max_tokens} "
            f"(longest: {self.longest}) and were dropped; raise data.max_prompt_tokens."
        )


def check_chat_template(tokenizer: Any, rows: Sequence[dict[str, Any]], chat_template: bool) -> None:
    """Raise DataError when rows need a chat template the tokenizer does not have."""
    if getattr(tokenizer, "chat_template", None):
        return
    if any(isinstance(row.get("prompt"), list) and row.get("prompt_ids") is None for row in rows):
        raise DataError(
            "the tokenizer has no chat template, but prompts are message lists; use a chat/instruct "
            "tokenizer (its tokenizer_config.json holds `chat_template`) or give string prompts."
        )
    if chat_template and any(row.get("prompt_ids") is None for row in rows):
        raise DataError(
            "data.chat_template=true, but the tokenizer has no chat template; set data.chat_template=false "
            "to encode string prompts as raw text, or use a tokenizer with a chat template."
        )


def encode_prompt(
    prompt: str | list[dict[str, Any]], tokenizer: Any, *, chat_template: bool
) -> tuple[list[int], str]:
    """Prompt (string or message list) -> (token ids, rendered text)."""
    if isinstance(prompt, list) or chat_template:
        # text parts joined into one string, as a text model's template reads them
        messages = (
            template_messages(with_template_calls(prompt))[0]
            if isinstance(prompt, list)
            else [{"role": "user", "content": prompt}]
        )
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = prompt
    return list(tokenizer.encode(text, add_special_tokens=False)), text


def row_prompt(row: dict[str, Any], tokenizer: Any, *, chat_template: bool) -> tuple[list[int], str]:
    """A row's prompt ids and text: its `prompt_ids` when given (text decoded from them), else rendered."""
    if row.get("prompt_ids") is not None:
        ids = list(row["prompt_ids"])
        return ids, tokenizer.decode(ids)
    return encode_prompt(row["prompt"], tokenizer, chat_template=chat_template)


def cut(ids: list[int], max_tokens: int, side: Side) -> list[int]:
    """Keep `max_tokens` ids, cutting from the `side` end."""
    return ids[len(ids) - max_tokens :] if side == "left" else ids[:max_tokens]


def overlong_problem(row_no: int, length: int, max_tokens: int, what: str = "prompt") -> str:
    return (
        f"row {row_no}: {what} is {length} tokens, over data.max_prompt_tokens={max_tokens}; raise "
        "data.max_prompt_tokens or set data.overlong_prompts to drop or truncate."
    )


def render_prompts(
    rows: Sequence[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_prompt_tokens: int,
    overlong: Overlong = "drop",
    truncation_side: Side = "left",
    chat_template: bool = True,
    source: str = "dataset",
    codec: ImageCodec | None = None,
) -> tuple[list[PromptItem], RenderReport]:
    """Validated rows -> (prompt items, report). `metadata` is the row without `prompt`, `prompt_ids` and
    `images`; `codec` (a vision-language model's) renders rows whose messages show images.

    overlong: "drop" skips prompts over `max_prompt_tokens`, "truncate" cuts them from `truncation_side`,
    "error" raises a DataError listing them. Raises DataError too when every prompt was left out.
    """
    if overlong not in ("drop", "truncate", "error"):
        raise ValueError(f"overlong={overlong!r}: use drop, truncate or error.")
    check_chat_template(tokenizer, rows, chat_template)
    report = RenderReport(total=len(rows), max_tokens=max_prompt_tokens)
    items: list[PromptItem] = []
    problems: list[str] = []
    for row_id, row in enumerate(rows):
        images: tuple[ImageInput, ...] = ()
        if row.get("prompt_ids") is None and row_has_images(row):
            if codec is None:
                problems.append(text_model_problem(row_id + 1))
                continue
            try:
                ids, text, images = image_prompt(row, tokenizer, codec, row_id + 1)
            except BadImageRow as err:
                report.drop_bad_image(row_id, err, source)
                continue
        else:
            ids, text = row_prompt(row, tokenizer, chat_template=chat_template)
        report.longest = max(report.longest, len(ids))
        if len(ids) > max_prompt_tokens:
            if images:  # never cut: a cut would split an image's pads
                problem = overlong_image_problem(
                    row_id + 1, len(ids), images, max_prompt_tokens, "data.max_prompt_tokens"
                )
                if overlong == "error":
                    problems.append(problem)
                else:
                    report.drop_overlong_images(row_id, problem, source)
                continue
            if overlong == "error":
                problems.append(overlong_problem(row_id + 1, len(ids), max_prompt_tokens))
                continue
            if overlong == "drop":
                report.dropped += 1
                report.dropped_row_ids.append(row_id)
                continue
            ids = cut(ids, max_prompt_tokens, truncation_side)
            text = str(tokenizer.decode(ids))  # one sequence: a str (the stubs say str | list[str])
            report.truncated += 1
        metadata = {k: v for k, v in row.items() if k not in PROMPT_FIELDS}
        report.image_tokens += [im.num_tokens for im in images]
        items.append(PromptItem(row_id, ids, text, metadata, images))
    raise_problems(source, problems, len(rows))
    if rows and not items:
        raise report.no_rows_left(source, len(rows))
    return items, report
