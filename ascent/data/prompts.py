"""Render validated rows into prompt token ids (design: "dataset rows -> prompts").

A message-list prompt always goes through the tokenizer's chat template with the generation prompt appended;
a string prompt goes through it as one user message (or is encoded raw with `chat_template=False`). Rendered
text is encoded without adding special tokens: the template already holds them. Rows that carry
`prompt_ids` skip rendering. Prompts longer than `max_prompt_tokens` are dropped, truncated or rejected, and
the `RenderReport` always counts what happened: nothing is cut silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ascent.data.validation import DataError, raise_problems

if TYPE_CHECKING:  # transformers is imported where the tokenizer is loaded
    from transformers import PreTrainedTokenizerBase

Overlong = Literal["drop", "truncate", "error"]
Side = Literal["left", "right"]
PROMPT_FIELDS = ("prompt", "prompt_ids")


@dataclass
class PromptItem:
    """One renderable prompt: its row index (0-based), token ids, rendered text and the row's other fields."""

    row_id: int
    prompt_ids: list[int]
    prompt_text: str
    metadata: dict[str, Any]


@dataclass
class RenderReport:
    """What the length policy did; `summary()` is the line the caller logs."""

    total: int = 0
    dropped: int = 0
    truncated: int = 0
    longest: int = 0
    max_tokens: int = 0
    dropped_row_ids: list[int] = field(default_factory=list)

    @property
    def kept(self) -> int:
        return self.total - self.dropped

    def __str__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        return (
            f"{self.kept}/{self.total} prompts kept; {self.dropped} dropped and {self.truncated} truncated "
            f"over {self.max_tokens} tokens (longest: {self.longest})"
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
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
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
) -> tuple[list[PromptItem], RenderReport]:
    """Validated rows -> (prompt items, report). `metadata` is the row without `prompt` and `prompt_ids`.

    overlong: "drop" skips prompts over `max_prompt_tokens`, "truncate" cuts them from `truncation_side`,
    "error" raises a DataError listing them. Raises DataError too when every prompt was dropped.
    """
    if overlong not in ("drop", "truncate", "error"):
        raise ValueError(f"overlong={overlong!r}: use drop, truncate or error.")
    check_chat_template(tokenizer, rows, chat_template)
    report = RenderReport(total=len(rows), max_tokens=max_prompt_tokens)
    items: list[PromptItem] = []
    problems: list[str] = []
    for row_id, row in enumerate(rows):
        ids, text = row_prompt(row, tokenizer, chat_template=chat_template)
        report.longest = max(report.longest, len(ids))
        if len(ids) > max_prompt_tokens:
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
        items.append(PromptItem(row_id=row_id, prompt_ids=ids, prompt_text=text, metadata=metadata))
    raise_problems(source, problems, len(rows))
    if rows and not items:
        raise DataError(
            f"{source}: all {len(rows)} prompts are over data.max_prompt_tokens={max_prompt_tokens} "
            f"(longest: {report.longest}) and were dropped; raise data.max_prompt_tokens."
        )
    return items, report
