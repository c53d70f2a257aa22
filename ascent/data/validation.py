"""Check dataset rows before anything is rendered, and report every problem at once.

A row is a dict with a `prompt` (a non-empty string, or a non-empty list of `{role, content}` messages whose
content is a string or a list of text, image and video parts, `ascent.models.content`; a video part's
sampling options are checked here too, `ascent.envs.video`; an assistant message may call tools as the
OpenAI API writes them, `ascent.models.tool_calls`), an optional `reward_fn` and `data_source` (strings), optional `prompt_ids` (pre-tokenized prompt: a list of
ints) and any other metadata the reward reads (e.g. `answer`). Problems are collected over the whole file
and raised as one `DataError` naming the source, the row (1-based) and the field, so a user fixes a file in
one pass instead of one error at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ascent.envs.video import VideoError, sampling, sequence_indices
from ascent.errors import AscentError
from ascent.models.content import ContentError, VideoRef, has_images, message_problem, template_messages

MESSAGE_ROLES = ("system", "user", "assistant", "tool")
MAX_REPORTED_PROBLEMS = 10


class DataError(AscentError):
    """A dataset problem; the message names the source file, the row number, the field and the fix."""

    def __init__(self, message: str, problems: Sequence[str] = ()):
        super().__init__(message)
        self.problems = list(problems)


def raise_problems(source: str, problems: list[str], num_rows: int) -> None:
    """Raise one DataError listing the first MAX_REPORTED_PROBLEMS problems (and the total); no-op if none.

    A single problem reads as one line: "data.train_path=x.jsonl row 17: field 'prompt' is empty; ...".
    """
    if not problems:
        return
    if len(problems) == 1:
        only = problems[0]
        raise DataError(f"{source} {only}" if only.startswith("row ") else f"{source}: {only}", problems)
    shown = problems[:MAX_REPORTED_PROBLEMS]
    more = len(problems) - len(shown)
    header = f"{source}: {len(problems)} problem(s) in {num_rows} rows"
    header += f" (first {len(shown)} shown):" if more else ":"
    lines = [header, *(f"  {p}" for p in shown)]
    if more:
        lines.append(f"  ... and {more} more.")
    raise DataError("\n".join(lines), problems)


def validate_rows(rows: Sequence[Any], source: str, *, tokenizer_vocab_size: int | None = None) -> None:
    """Raise DataError if any row is malformed (see the module docstring); return None when all rows are fine.

    `source` names the data in messages, e.g. "data.train_path=x.jsonl". With `tokenizer_vocab_size`, every
    `prompt_ids` entry must lie in [0, vocab_size).
    """
    if not rows:
        raise DataError(f"{source}: the dataset has no rows; point it at a file with at least one prompt.")
    problems: list[str] = []
    string_rows: list[int] = []
    message_rows: list[int] = []
    for index, row in enumerate(rows):
        row_no = index + 1
        if not isinstance(row, dict):
            problems.append(f"row {row_no}: expected an object (dict), got {type(row).__name__}.")
            continue
        kind = _check_prompt(row, row_no, problems)
        if kind == "string":
            string_rows.append(row_no)
        elif kind == "messages":
            message_rows.append(row_no)
        _check_optional_strings(row, row_no, problems)
        _check_prompt_ids(row, row_no, tokenizer_vocab_size, problems)
    if string_rows and message_rows:
        problems.append(
            f"field 'prompt' mixes single-turn strings ({len(string_rows)} rows, first row {string_rows[0]}) "
            f"and multi-turn message lists ({len(message_rows)} rows, first row {message_rows[0]}); "
            "use one form per file."
        )
    raise_problems(source, problems, len(rows))


def _check_prompt(row: dict[str, Any], row_no: int, problems: list[str]) -> str | None:
    """Append the prompt's problems; return "string" or "messages" when the prompt is well-formed."""
    if "prompt" not in row:
        problems.append(f"row {row_no}: field 'prompt' is missing; every row needs a non-empty prompt.")
        return None
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            problems.append(f"row {row_no}: field 'prompt' is empty; every row needs a non-empty prompt.")
            return None
        if row.get("images"):
            problems.append(
                f"row {row_no}: field 'images' is set but 'prompt' is a string; write the prompt as messages "
                "whose content shows each image with a {'type': 'image'} part."
            )
            return None
        return "string"
    if isinstance(prompt, list):
        if not prompt:
            problems.append(
                f"row {row_no}: field 'prompt' is an empty message list; add at least one message."
            )
            return None
        found = len(problems)
        for msg_index, message in enumerate(prompt):
            _check_message(message, row_no, msg_index, problems)
        if len(problems) == found and (has_images(prompt) or row.get("images") is not None):
            try:
                _check_videos(template_messages(prompt, row.get("images"))[1])
            except (ContentError, VideoError) as err:
                problems.append(f"row {row_no}: field 'prompt' {err}.")
        return "messages" if len(problems) == found else None
    problems.append(
        f"row {row_no}: field 'prompt' has type {type(prompt).__name__}; "
        "use a string or a list of {role, content} messages."
    )
    return None


def _check_videos(refs: Sequence[Any]) -> None:
    """Raise VideoError, naming the part, for a video part whose sampling options cannot be used."""
    for ref in refs:
        if isinstance(ref, VideoRef):
            try:
                s = sampling(ref.options or {})
                if isinstance(ref.value, list):
                    sequence_indices(len(ref.value), s)
            except VideoError as err:
                raise VideoError(f"video {ref.source}: {err}") from err


def _check_message(message: Any, row_no: int, msg_index: int, problems: list[str]) -> None:
    where = f"row {row_no}: field 'prompt' message {msg_index}"
    if not isinstance(message, dict):
        problems.append(
            f"{where} has type {type(message).__name__}; each message is a {{role, content}} object."
        )
        return
    role = message.get("role")
    if role not in MESSAGE_ROLES:
        problems.append(f"{where} has role {role!r}; use one of {', '.join(MESSAGE_ROLES)}.")
    problem = message_problem(message)
    if problem is not None:
        problems.append(f"{where}: {problem}.")


def _check_optional_strings(row: dict[str, Any], row_no: int, problems: list[str]) -> None:
    for field in ("reward_fn", "data_source"):
        if field in row and row[field] is not None and not isinstance(row[field], str):
            problems.append(
                f"row {row_no}: field '{field}' has type {type(row[field]).__name__}; it must be a string."
            )
    if isinstance(row.get("reward_fn"), str) and not row["reward_fn"].strip():
        problems.append(f"row {row_no}: field 'reward_fn' is empty; remove it or name a reward function.")


def _check_prompt_ids(row: dict[str, Any], row_no: int, vocab_size: int | None, problems: list[str]) -> None:
    if row.get("prompt_ids") is None:
        return
    ids = row["prompt_ids"]
    where = f"row {row_no}: field 'prompt_ids'"
    if not isinstance(ids, list) or not ids:
        problems.append(f"{where} must be a non-empty list of token ids.")
        return
    bad_type = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
    if bad_type:
        problems.append(f"{where} holds non-integers (first: {bad_type[0]!r}); token ids are ints.")
        return
    if vocab_size is not None:
        outside = [t for t in ids if not 0 <= t < vocab_size]
        if outside:
            problems.append(
                f"{where} holds {len(outside)} id(s) outside the vocabulary [0, {vocab_size}) "
                f"(first: {outside[0]}); re-tokenize with the model's tokenizer."
            )


def validate_message_weights(rows: Sequence[Any], source: str) -> None:
    """Raise DataError unless every `weight` in the conversations' `messages` is 0 or 1 on an assistant
    message (OpenAI fine-tuning's per-message weight: 0 leaves the turn out of the loss; default 1) and every
    conversation keeps at least one assistant turn in the loss."""
    problems: list[str] = []
    for index, row in enumerate(rows):
        messages = row.get("messages") if isinstance(row, dict) else None
        if isinstance(messages, list):  # a malformed conversation is conversation_tokens' to report
            _check_weights([m for m in messages if isinstance(m, dict)], index + 1, problems)
    raise_problems(source, problems, len(rows))


def _check_weights(messages: list[dict[str, Any]], row_no: int, problems: list[str]) -> None:
    found = len(problems)
    for i, m in enumerate(messages):
        _check_no_loss(m, f"row {row_no}: field 'messages' message {i} 'no_loss'", problems)
        if "weight" not in m:
            continue
        where, weight = f"row {row_no}: field 'messages' message {i} 'weight'", m["weight"]
        if m.get("role") != "assistant":
            problems.append(
                f"{where} is set on a {m.get('role')!r} message; only assistant messages are trained, so "
                "only they take a weight. Remove it."
            )
        elif isinstance(weight, bool) or weight not in (0, 1):
            problems.append(
                f"{where} is {weight!r}; use 0 (leave this turn out of the loss) or 1 (train on it)."
            )
    trained = [m for m in messages if m.get("role") == "assistant" and m.get("weight", 1) == 1]
    if len(problems) == found and not trained and any(m.get("role") == "assistant" for m in messages):
        problems.append(
            f"row {row_no}: field 'messages': every assistant message has weight 0, so the row trains nothing; "
            "give at least one assistant message weight 1, or remove the row."
        )


def _check_no_loss(message: dict[str, Any], where: str, problems: list[str]) -> None:
    """`no_loss` (substrings of an assistant message's text whose tokens stay out of the loss) must be a
    list of non-empty strings found in the message's text content."""
    if "no_loss" not in message:
        return
    spans, content = message["no_loss"], message.get("content")
    if message.get("role") != "assistant":
        problems.append(
            f"{where} is set on a {message.get('role')!r} message; only assistant messages take it."
        )
    elif not isinstance(content, str):
        problems.append(f"{where} needs the message's content to be text; drop 'no_loss' or use a string.")
    elif not isinstance(spans, list) or not all(isinstance(x, str) and x for x in spans):
        problems.append(f"{where} is {spans!r}; use a list of non-empty substrings of the message's content.")
    else:
        missing = [x for x in spans if x not in content]
        if missing:
            problems.append(f"{where}: {missing[0]!r} is not in the message's content; fix or remove it.")
