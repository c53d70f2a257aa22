"""Chat templates chosen in the config (`model.chat_template`): a Jinja file or a built-in name.

`resolve_chat_template` turns the setting into the template text and `set_chat_template` puts it on the
tokenizer that renders the run's prompts (`ascent.orchestrator.setup.build_datasets`): every prompt, every
environment turn and the tokenizer saved with checkpoints then use it. The dict is plain so a reader can
open it; add a name here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ascent.data.validation import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Tok = TypeVar("Tok", bound="PreTrainedTokenizerBase")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT_TEMPLATES = {"chatml": CHATML}


def resolve_chat_template(value: str, field: str = "model.chat_template") -> str:
    """The template text `value` names: a built-in name (`CHAT_TEMPLATES`) or a path to a template file.

    Raises DataError for a missing or empty file, or a name that is neither.
    """
    if value in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[value]
    path = Path(value).expanduser()
    looks_like_file = path.suffix in (".jinja", ".j2", ".txt") or "/" in value
    if not path.is_file():
        what = f"no file at {path.resolve()}" if looks_like_file else "not a built-in name nor a file"
        raise DataError(
            f"{field}={value!r}: {what}; give a path to a Jinja template file or one of "
            f"{', '.join(CHAT_TEMPLATES)}."
        )
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise DataError(f"{field}={value!r}: the file is empty; write the Jinja chat template into it.")
    return text


def set_chat_template(tokenizer: Tok, value: str | None, field: str = "model.chat_template") -> Tok:
    """`tokenizer` with its chat template replaced by the one `value` names (None: left as it is)."""
    if value is not None:
        tokenizer.chat_template = resolve_chat_template(value, field)
    return tokenizer
