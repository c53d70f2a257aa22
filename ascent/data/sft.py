"""Prompt/response pairs and whole conversations for supervised warm-start (`ascent sft`).

The prompt renders exactly as for RL (`ascent.data.prompts`), so the SFT model sees the same template it will
be sampled with. The response is encoded without special tokens and followed by the EOS token, so the model
learns to stop; the loss later applies to `response_ids` only.

A row with `messages` instead (a conversation: system/user messages, then assistant turns with tool results
or the world's answers between them; optional `tools` schemas) is encoded the way a multi-turn episode is
sampled (`ascent.envs.chat.ChatTokens.conversation_ids`, token for token), with loss on the assistant turns
only: demonstrations of tool use train on exactly the ids RL will later sample.

An assistant message may call tools as the OpenAI API writes them (`tool_calls`, content null, "" or text;
then `tool` messages with the results): the chat template renders each call in the model family's own
format (`ascent.models.tool_calls`), and the call's tokens are trained like the turn's text.

Messages may show images (content parts in user and tool messages, `ascent.models.content`): with a
vision-language model's `codec` each image becomes its pads in the ids (loss mask 0) and the example carries
the images; a row whose image is missing or unreadable is left out and counted, as `render_prompts` does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ascent.data.images import (
    BadImageRow,
    decode_images,
    expand_turns,
    image_prompt,
    overlong_image_problem,
    row_has_images,
    text_model_problem,
)
from ascent.data.prompts import (
    Overlong,
    RenderReport,
    Side,
    check_chat_template,
    cut,
    overlong_problem,
    row_prompt,
)
from ascent.data.validation import DataError, raise_problems, validate_message_weights, validate_rows
from ascent.messages import ImageInput
from ascent.models.content import IMAGES_COLUMN, message_problem, template_messages
from ascent.models.tool_calls import with_template_calls

if TYPE_CHECKING:
    from ascent.models.vision import ImageCodec

if TYPE_CHECKING:  # transformers is imported where the tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class SFTExample:
    """One training pair: prompt token ids (no loss) and response token ids ending in EOS (loss)."""

    prompt_ids: list[int]
    response_ids: list[int]
    row_id: int = 0
    loss_mask: list[int] | None = None  # conversations: 0 on tool and world tokens; None: all 1
    images: tuple[ImageInput, ...] = ()  # one per image-pad run of prompt_ids + response_ids, in order

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def validate_responses(rows: Sequence[dict[str, Any]], source: str, response_key: str) -> None:
    """Raise DataError unless every row has a non-empty string under `response_key`."""
    problems: list[str] = []
    for index, row in enumerate(rows):
        where = f"row {index + 1}: field '{response_key}'"
        if response_key not in row:
            problems.append(
                f"{where} is missing; every SFT row needs a target response (or set response_key)."
            )
        elif not isinstance(row[response_key], str):
            problems.append(
                f"{where} has type {type(row[response_key]).__name__}; the response must be a string."
            )
        elif not row[response_key]:
            problems.append(f"{where} is empty; every SFT row needs a non-empty response.")
    raise_problems(source, problems, len(rows))


def encode_response(text: str, tokenizer: Any) -> list[int]:
    """Response text -> ids without special tokens, plus EOS."""
    if tokenizer.eos_token_id is None:
        raise DataError(
            "the tokenizer has no EOS token; SFT responses end in EOS so the model learns to stop."
        )
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def render_sft_examples(
    rows: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, **options: Any
) -> list[SFTExample]:
    """`render_sft_examples_and_report` (same keyword options) returning only the examples; drops and cuts
    are logged as a warning."""
    examples, report = render_sft_examples_and_report(rows, tokenizer, **options)
    if report.dropped or report.truncated:
        log.warning("%s: SFT pairs: %s", options.get("source", "dataset"), report.summary())
    return examples


def render_sft_examples_and_report(
    rows: Sequence[dict[str, Any]],
    tokenizer: Any,
    *,
    response_key: str = "response",
    max_prompt_tokens: int,
    max_total_tokens: int | None = None,
    overlong: Overlong = "drop",
    truncation_side: Side = "left",
    chat_template: bool = True,
    source: str = "dataset",
    codec: ImageCodec | None = None,
    turn_end_loss: bool = True,
) -> tuple[list[SFTExample], RenderReport]:
    """Validate rows (prompt and `response_key`) and render them -> (examples, report).

    Prompts over `max_prompt_tokens` follow `overlong` like `render_prompts`. A pair over `max_total_tokens`
    is dropped, has its response's tail cut ("truncate"), or is reported ("error"); an example with images
    is dropped rather than cut. `codec` renders rows that show images (a vision-language model's).
    `turn_end_loss=False` leaves the EOS closing each response or assistant turn out of the loss; an
    assistant message with `"weight": 0` is out of it too (`ascent.envs.chat.ChatTokens.conversation_ids`).
    """
    conversations = _validate(rows, tokenizer, source, response_key, chat_template)
    report = RenderReport(total=len(rows), max_tokens=max_prompt_tokens)
    examples: list[SFTExample] = []
    problems: list[str] = []
    for row_id, row in enumerate(rows):
        try:
            options = (response_key, chat_template, source, turn_end_loss)
            rendered = _render_row(row, row_id, tokenizer, conversations, options, codec)
        except BadImageRow as err:
            report.drop_bad_image(row_id, err, source)
            continue
        if rendered is None:
            problems.append(text_model_problem(row_id + 1))
            continue
        prompt_ids, response_ids, mask, images = rendered
        report.longest = max(report.longest, len(prompt_ids))
        over_prompt = len(prompt_ids) > max_prompt_tokens
        total = len(prompt_ids if not over_prompt else cut(prompt_ids, max_prompt_tokens, truncation_side))
        room = None if max_total_tokens is None else max_total_tokens - total
        over_total = room is not None and len(response_ids) > room
        if not (over_prompt or over_total):
            report.image_tokens += [im.num_tokens for im in images]
            examples.append(SFTExample(prompt_ids, response_ids, row_id, mask, images))
            continue
        if images:  # never cut: a cut would split an image's pads
            limits = (max_prompt_tokens, max_total_tokens)
            problem = _image_pair_problem(row_id, prompt_ids, total + len(response_ids), images, limits)
            if overlong == "error":
                problems.append(problem)
            else:
                report.drop_overlong_images(row_id, problem, source)
        elif overlong == "error":
            problems.append(
                _sft_problem(row_id + 1, prompt_ids, response_ids, max_prompt_tokens, max_total_tokens)
            )
        elif overlong == "drop" or (room is not None and room <= 0):
            report.dropped += 1
            report.dropped_row_ids.append(row_id)
        else:
            prompt_ids = cut(prompt_ids, max_prompt_tokens, truncation_side) if over_prompt else prompt_ids
            response_ids = response_ids[:room] if over_total else response_ids
            mask = None if mask is None else mask[: len(response_ids)]
            report.truncated += 1
            examples.append(SFTExample(prompt_ids, response_ids, row_id, mask))
    raise_problems(source, problems, len(rows))
    if rows and not examples:
        if report.bad_images:
            raise report.no_rows_left(source, len(rows))
        raise DataError(
            f"{source}: every pair was dropped as too long ({report.summary()}); raise the token limits."
        )
    return examples, report


def _validate(
    rows: Sequence[dict[str, Any]], tokenizer: Any, source: str, response_key: str, chat_template: bool
) -> bool:
    """Check the rows as `render_sft_examples_and_report` renders them -> whether they are conversations
    (`messages`: their loss weights) rather than prompt/response pairs (ids, responses, chat template)."""
    conversations = is_conversations(rows, source, response_key)
    if conversations:
        validate_message_weights(rows, source)
    else:
        validate_rows(rows, source, tokenizer_vocab_size=len(tokenizer))
        validate_responses(rows, source, response_key)
        check_chat_template(tokenizer, rows, chat_template)
    return conversations


def _image_pair_problem(
    row_id: int,
    prompt_ids: list[int],
    pair_tokens: int,
    images: tuple[ImageInput, ...],
    limits: tuple[int, int | None],
) -> str:
    """What is too long about an overlong example with images (never cut: a cut would split an image's
    pads): its prompt over `max_prompt_tokens`, else the pair's `pair_tokens` over `max_total_tokens`."""
    max_prompt_tokens, max_total_tokens = limits
    if len(prompt_ids) > max_prompt_tokens:
        return overlong_image_problem(
            row_id + 1, len(prompt_ids), images, max_prompt_tokens, "data.max_prompt_tokens"
        )
    return overlong_image_problem(
        row_id + 1,
        pair_tokens,
        images,
        int(max_total_tokens or 0),
        "max_total_tokens",
        "prompt + response",
    )


Rendered = tuple[list[int], list[int], list[int] | None, tuple[ImageInput, ...]]


def _render_row(
    row: dict[str, Any],
    row_id: int,
    tokenizer: Any,
    conversations: bool,
    options: tuple[str, bool, str, bool],
    codec: ImageCodec | None,
) -> Rendered | None:
    """One row -> (prompt ids, response ids, loss mask or None, images); None: it shows images and there is
    no codec (a text model). `options`: (response_key, chat_template, source, turn_end_loss). Raises
    BadImageRow for an image it cannot use."""
    response_key, chat_template, source, turn_end_loss = options
    if row.get("prompt_ids") is None and row_has_images(row, "messages" if conversations else "prompt"):
        if codec is None:
            return None
    else:
        codec = None
    if conversations:
        return conversation_tokens(row, row_id, tokenizer, source, codec, turn_end_loss)
    response_ids = encode_response(row[response_key], tokenizer)
    mask = None if turn_end_loss else [1] * (len(response_ids) - 1) + [0]  # the closing EOS out of the loss
    if codec is not None:
        prompt_ids, _, images = image_prompt(row, tokenizer, codec, row_id + 1)
        return prompt_ids, response_ids, mask, images
    return row_prompt(row, tokenizer, chat_template=chat_template)[0], response_ids, mask, ()


def is_conversations(rows: Sequence[dict[str, Any]], source: str, response_key: str) -> bool:
    """Whether the rows are conversations (`messages`) rather than prompt/response pairs; mixing is
    refused."""
    chats = [i + 1 for i, r in enumerate(rows) if "messages" in r and response_key not in r]
    if chats and len(chats) != len(rows):
        pair = next(i + 1 for i, r in enumerate(rows) if i + 1 not in set(chats))
        raise DataError(
            f"{source}: row {chats[0]} is a conversation (`messages`) but row {pair} is a prompt/response "
            "pair; an SFT file holds one kind. Split the file, or write the pairs as conversations."
        )
    return bool(chats)


def conversation_tokens(
    row: dict[str, Any],
    row_id: int,
    tokenizer: Any,
    source: str,
    codec: ImageCodec | None = None,
    turn_end_loss: bool = True,
) -> Rendered:
    """A `messages` row -> (prompt ids, response ids, loss mask, images) as a multi-turn episode samples them;
    with `codec`, the images its messages show (each its pads, mask 0). Assistant messages of weight 0, and
    with `turn_end_loss=False` every turn's EOS, have mask 0."""
    from ascent.envs.chat import ChatTokens  # tokenizer-only module: the episode's own encoding

    messages = row["messages"]
    where = f"{source}: row {row_id + 1}: field 'messages'"
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise DataError(
            f"{where} must be a list of {{role, content}} messages with string roles and string (or "
            "content-part list) contents."
        )
    for i, m in enumerate(messages):
        problem = message_problem(m)
        if problem is not None:
            raise DataError(f"{where} message {i}: {problem}.")
    if tokenizer.eos_token_id is None or not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: conversations need a tokenizer with an EOS token and a chat template.")
    images: tuple[ImageInput, ...] = ()
    try:
        if codec is not None:
            messages, images = decode_images(messages, row.get(IMAGES_COLUMN), codec, row_id + 1)
        else:  # text parts joined into one string, as a text model's template reads them
            messages = template_messages(with_template_calls(messages))[0]
        chat = ChatTokens(tokenizer)
        prompt, response, mask = chat.conversation_ids(messages, row.get("tools"), turn_end_loss)
    except ValueError as e:  # ContentError is one: a malformed part or an images column that does not match
        raise DataError(f"{where}: {e}.") from e
    if codec is not None:
        prompt, response, mask = expand_turns(prompt, response, mask, images, codec, row_id + 1)
    return prompt, response, mask, images


def _sft_problem(
    row_no: int, prompt: list[int], response: list[int], max_prompt: int, max_total: int | None
) -> str:
    if len(prompt) > max_prompt:
        return overlong_problem(row_no, len(prompt), max_prompt)
    return (
        f"row {row_no}: prompt + response is {len(prompt) + len(response)} tokens, over max_total_tokens="
        f"{max_total}; raise it or set data.overlong_prompts to drop or truncate."
    )
