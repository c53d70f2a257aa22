"""Prompt/response pairs for supervised warm-start (`ascent sft`).

The prompt renders exactly as for RL (`ascent.data.prompts`), so the SFT model sees the same template it will
be sampled with. The response is encoded without special tokens and followed by the EOS token, so the model
learns to stop; the loss later applies to `response_ids` only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ascent.data.prompts import (
    Overlong,
    RenderReport,
    Side,
    check_chat_template,
    cut,
    overlong_problem,
    row_prompt,
)
from ascent.data.validation import DataError, raise_problems, validate_rows

log = logging.getLogger(__name__)


@dataclass
class SFTExample:
    """One training pair: prompt token ids (no loss) and response token ids ending in EOS (loss)."""

    prompt_ids: list[int]
    response_ids: list[int]
    row_id: int = 0

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


def render_sft_examples(rows: Sequence[dict[str, Any]], tokenizer: Any, **options: Any) -> list[SFTExample]:
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
) -> tuple[list[SFTExample], RenderReport]:
    """Validate rows (prompt and `response_key`) and render them -> (examples, report).

    Prompts over `max_prompt_tokens` follow `overlong` like `render_prompts`. A pair over `max_total_tokens`
    is dropped, has its response's tail cut ("truncate"), or is reported ("error").
    """
    validate_rows(rows, source, tokenizer_vocab_size=len(tokenizer))
    validate_responses(rows, source, response_key)
    check_chat_template(tokenizer, rows, chat_template)
    report = RenderReport(total=len(rows), max_tokens=max_prompt_tokens)
    examples: list[SFTExample] = []
    problems: list[str] = []
    for row_id, row in enumerate(rows):
        prompt_ids, _ = row_prompt(row, tokenizer, chat_template=chat_template)
        response_ids = encode_response(row[response_key], tokenizer)
        report.longest = max(report.longest, len(prompt_ids))
        over_prompt = len(prompt_ids) > max_prompt_tokens
        total = len(prompt_ids if not over_prompt else cut(prompt_ids, max_prompt_tokens, truncation_side))
        room = None if max_total_tokens is None else max_total_tokens - total
        over_total = room is not None and len(response_ids) > room
        if not (over_prompt or over_total):
            examples.append(SFTExample(prompt_ids, response_ids, row_id))
            continue
        if overlong == "error":
            problems.append(
                _sft_problem(row_id + 1, prompt_ids, response_ids, max_prompt_tokens, max_total_tokens)
            )
        elif overlong == "drop" or (room is not None and room <= 0):
            report.dropped += 1
            report.dropped_row_ids.append(row_id)
        else:
            prompt_ids = cut(prompt_ids, max_prompt_tokens, truncation_side) if over_prompt else prompt_ids
            response_ids = response_ids[:room] if over_total else response_ids
            report.truncated += 1
            examples.append(SFTExample(prompt_ids, response_ids, row_id))
    raise_problems(source, problems, len(rows))
    if rows and not examples:
        raise DataError(
            f"{source}: every pair was dropped as too long ({report.summary()}); raise the token limits."
        )
    return examples, report


def _sft_problem(
    row_no: int, prompt: list[int], response: list[int], max_prompt: int, max_total: int | None
) -> str:
    if len(prompt) > max_prompt:
        return overlong_problem(row_no, len(prompt), max_prompt)
    return (
        f"row {row_no}: prompt + response is {len(prompt) + len(response)} tokens, over max_total_tokens="
        f"{max_total}; raise it or set data.overlong_prompts to drop or truncate."
    )
