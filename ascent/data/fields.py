"""Row fields under the names the data path reads: the prompt and answer columns a dataset calls otherwise
(`data.prompt_key`, `data.answer_key`) and a system prompt from the config (`data.system_prompt`).

Runs between `load_rows` and `validate_rows` (`ascent.data.builders`, `ascent.orchestrator.setup`), so the
rest of the data path sees `prompt` and `answer` whatever a file calls them. `RowFields` carries the same
settings for `ascent eval`, which takes them as options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascent.data.loading import load_rows
from ascent.data.validation import DataError


def map_fields(
    rows: list[dict[str, Any]], source: str, prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[dict[str, Any]]:
    """Rows with column `prompt_key` renamed to `prompt` and `answer_key` to `answer` (new dicts; identity
    keys leave the rows as they are). Every row needs `prompt_key`; `answer_key` is optional per row (a
    reward may not read it), but a key that no row has is refused as a typo.

    Raises DataError naming the key, the first row without it and the columns the file has.
    """
    renames = {k: v for k, v in ((prompt_key, "prompt"), (answer_key, "answer")) if k != v}
    if not renames or not rows:
        return rows
    for key, target in renames.items():
        missing = [i for i, row in enumerate(rows) if key not in row]
        required = target == "prompt"
        if (required and missing) or len(missing) == len(rows):
            columns = sorted({c for row in rows for c in row})
            raise DataError(
                f"{source} row {missing[0] + 1}: data.{target}_key={key!r} names no column of this row "
                f"(the file has {', '.join(columns)}); set data.{target}_key to the column that holds the "
                f"{target}."
            )
        clash = next((i for i, row in enumerate(rows) if target in row and key in row), None)
        if clash is not None:
            raise DataError(
                f"{source} row {clash + 1}: data.{target}_key={key!r}, but the row has a {target!r} column "
                f"too; rename or drop one of them (or set data.{target}_key={target!r})."
            )
    return [{renames.get(k, k): v for k, v in row.items()} for row in rows]


def add_system_prompt(rows: list[dict[str, Any]], system_prompt: str, source: str) -> list[dict[str, Any]]:
    """Rows whose prompt starts with a system message holding `system_prompt`: a string prompt becomes
    [system, user], a message list gets the system message in front (its content parts, images included, stay
    as they are). Rows with `prompt_ids` are left alone (they are already tokens).

    Raises DataError for a row that already starts with a system message: two would be ambiguous, and a
    chat template may keep only one.
    """
    system = {"role": "system", "content": system_prompt}
    out: list[dict[str, Any]] = []
    for row_no, row in enumerate(rows, start=1):
        prompt = row.get("prompt")
        if row.get("prompt_ids") is not None or not isinstance(prompt, str | list):
            out.append(row)  # validate_rows reports a prompt of the wrong type
            continue
        first = prompt[0] if isinstance(prompt, list) and prompt else None
        if isinstance(first, dict) and first.get("role") == "system":
            raise DataError(
                f"{source} row {row_no}: the prompt already starts with a system message, and "
                "data.system_prompt is set; remove one of them (data.system_prompt=null keeps the rows' "
                "own)."
            )
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        out.append({**row, "prompt": [system, *messages]})
    return out


def prepare_rows(
    rows: list[dict[str, Any]],
    source: str,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    system_prompt: str | None = None,
) -> list[dict[str, Any]]:
    """`map_fields`, then `add_system_prompt` when `system_prompt` is set."""
    rows = map_fields(rows, source, prompt_key, answer_key)
    return add_system_prompt(rows, system_prompt, source) if system_prompt is not None else rows


@dataclass(frozen=True)
class RowFields:
    """How `ascent eval` reads its rows, as `data.*` / `model.chat_template` do in training: the prompt and
    answer columns, a system prompt, a `save_to_disk` directory's split and a chat template (file or name,
    `ascent.data.templates`)."""

    prompt_key: str = "prompt"
    answer_key: str = "answer"
    system_prompt: str | None = None
    split: str | None = None
    chat_template: str | None = None

    def rows(self, path: str) -> list[dict[str, Any]]:
        """The rows of `path` with the columns mapped and the system prompt added."""
        rows = load_rows(path, split=self.split)
        return prepare_rows(
            rows,
            path,
            prompt_key=self.prompt_key,
            answer_key=self.answer_key,
            system_prompt=self.system_prompt,
        )
