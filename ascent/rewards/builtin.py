"""Built-in string and number reward functions: exact_match, numeric_match, gsm8k, format.

Each follows the reward signature of `ascent.rewards` (prompt, response, response_ids, metadata, **kwargs)
and reads the reference answer from `metadata[answer_key]` (default "answer"). Unknown kwargs are ignored, so
one `reward.kwargs` section can serve a dataset whose rows pick different built-ins.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

# A number: optional sign (not glued to a preceding digit, so "3-5" yields 5), thousands commas, decimals.
_NUM = r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])[-+]?\.\d+"
NUMBER_RE = re.compile(rf"(?:{_NUM})")
FRACTION_RE = re.compile(rf"(?:{_NUM})\s*/\s*(?:{_NUM})|(?:{_NUM})")
GSM8K_ANSWER_RE = re.compile(r"####\s*([^\n]*)")
DEFAULT_FORMAT_PATTERN = r"####\s*[-+]?\$?\s*[\d,]*\.?\d+|\\boxed\{.+\}"
# The setting a missing answer's fix names: `ascent train`'s. A caller whose user sets it otherwise rewords it in
# the errors it shows (`RewardRunner(settings=...)`: `ascent eval`'s --answer-key); these functions know no CLI.
ANSWER_KEY_SETTING = "reward.kwargs.answer_key"


def answer_of(metadata: dict[str, Any], answer_key: str, fn_name: str) -> Any:
    """The row's reference answer, or a KeyError that names the field and the function."""
    if answer_key in metadata and metadata[answer_key] is None:
        raise KeyError(
            f"{fn_name} needs the reference answer, but dataset field {answer_key!r} is null on this row; "
            "give every row an answer (or drop the rows without one)."
        )
    if metadata.get(answer_key) is None:
        raise KeyError(
            f"{fn_name} needs the reference answer in dataset field {answer_key!r}; the row has fields "
            f"{sorted(metadata)}. Add the field or name the column that holds it with {ANSWER_KEY_SETTING}."
        )
    return metadata[answer_key]


def parse_number(text: str, fractions: bool = True) -> float | None:
    """One number written as text ("1,234", "-0.5", ".5", "3/4") -> float; None if it is not a number."""
    text = text.strip().replace(",", "")
    try:
        if fractions and "/" in text:
            num, den = (part.strip() for part in text.split("/", 1))
            return float(Fraction(num) / Fraction(den)) if float(den) != 0 else None
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


def find_numbers(text: str, fractions: bool = True) -> list[float]:
    """Every number in `text`, in order (fractions like 3/4 as one number when `fractions`)."""
    pattern = FRACTION_RE if fractions else NUMBER_RE
    values = (parse_number(m.group(0), fractions) for m in pattern.finditer(text))
    return [v for v in values if v is not None]


def gold_number(answer: Any, fractions: bool = True) -> float:
    """The numeric reference: a number, a numeric string, or a GSM8K solution ending in `#### x`."""
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    text = str(answer)
    marked = GSM8K_ANSWER_RE.findall(text)
    if marked:
        text = marked[-1]
    numbers = find_numbers(text, fractions)
    if not numbers:
        raise ValueError(f"reference answer {str(answer)[:80]!r} holds no number; numeric rewards need one.")
    return numbers[-1] if not marked else numbers[0]


def numbers_match(pred: float, gold: float, abs_tol: float, rel_tol: float) -> bool:
    return math.isclose(pred, gold, abs_tol=abs_tol, rel_tol=rel_tol)


def exact_match(
    prompt: str,
    response: str,
    response_ids: list[int],
    metadata: dict[str, Any],
    *,
    answer_key: str = "answer",
    **_: Any,
) -> float:
    """1.0 if the stripped response equals str(answer) stripped, else 0.0."""
    answer = answer_of(metadata, answer_key, "exact_match")
    return float(response.strip() == str(answer).strip())


def numeric_match(
    prompt: str,
    response: str,
    response_ids: list[int],
    metadata: dict[str, Any],
    *,
    answer_key: str = "answer",
    abs_tol: float = 1e-6,
    rel_tol: float = 0.0,
    fractions: bool = True,
    **_: Any,
) -> float:
    """1.0 if the last number in the response equals the numeric answer within tolerance, else 0.0."""
    gold = gold_number(answer_of(metadata, answer_key, "numeric_match"), fractions)
    numbers = find_numbers(response, fractions)
    return float(bool(numbers) and numbers_match(numbers[-1], gold, abs_tol, rel_tol))


def gsm8k(
    prompt: str,
    response: str,
    response_ids: list[int],
    metadata: dict[str, Any],
    *,
    answer_key: str = "answer",
    format_score: float = 0.0,
    abs_tol: float = 1e-6,
    **_: Any,
) -> float:
    """1.0 if the response's last `#### <answer>` matches the reference numerically.

    `format_score` is given when the response has a `#### <number>` that is wrong; 0.0 when it has none.
    The reference may be a number or a full GSM8K solution ending in `#### x`.
    """
    gold = gold_number(answer_of(metadata, answer_key, "gsm8k"))
    marked = GSM8K_ANSWER_RE.findall(response)
    numbers = find_numbers(marked[-1]) if marked else []
    if not numbers:
        return 0.0
    return 1.0 if numbers_match(numbers[0], gold, abs_tol, 0.0) else float(format_score)


def format_reward(
    prompt: str,
    response: str,
    response_ids: list[int],
    metadata: dict[str, Any],
    *,
    pattern: str = DEFAULT_FORMAT_PATTERN,
    fullmatch: bool = False,
    **_: Any,
) -> float:
    """1.0 if the response matches the regex `pattern` (searched, or whole with `fullmatch`), else 0.0.

    The default pattern asks for a final answer as `#### <number>` or `\\boxed{...}`.
    """
    regex = _compile(pattern)
    matched = regex.fullmatch(response.strip()) if fullmatch else regex.search(response)
    return float(matched is not None)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compile(pattern: str) -> re.Pattern[str]:
    if pattern not in _PATTERNS:
        try:
            _PATTERNS[pattern] = re.compile(pattern, re.DOTALL)
        except re.error as err:
            raise ValueError(f"reward.kwargs.pattern={pattern!r} is not a valid regex ({err}).") from err
    return _PATTERNS[pattern]
