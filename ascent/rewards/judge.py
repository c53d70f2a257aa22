"""The pure half of an LLM-as-judge: the prompt template, the parsers of its reply, and the judgement cache.

The orchestrator (`ascent.orchestrator.reward_models.JudgeScorer`) renders `template` for each episode, asks
a rollout engine for the reply, and parses it here. A reply that does not parse costs that sample a reward
of 0.0 and counts as a failure, as a failed reward function does (`ascent.rewards.runner`).

Parsers (`reward.judge.parser`): `score_0_10` (the last number in the reply, 0..10, scaled to 0..1),
`yes_no` (the first "yes" or "no" word: 1.0 or 0.0), or a regular expression whose first group (or whole
match) is the score as a number.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable

from ascent.errors import AscentError

Parser = Callable[[str], float]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


class JudgeConfigError(AscentError, ValueError):
    """A judge template or parser that cannot work; the message names the setting and the fix."""


class JudgeParseError(ValueError):
    """The judge's reply holds no score the parser can read."""


def score_0_10(reply: str) -> float:
    """The last number of `reply`, which must lie in 0..10, divided by 10."""
    numbers = _NUMBER.findall(reply)
    if not numbers:
        raise JudgeParseError(f"no number in the judge's reply {reply[:80]!r}")
    value = float(numbers[-1])
    if not 0.0 <= value <= 10.0:
        raise JudgeParseError(f"the judge's score {value:g} is outside 0..10")
    return value / 10.0


def yes_no(reply: str) -> float:
    """1.0 when the first yes/no word of `reply` is "yes", 0.0 for "no"."""
    found = _YES_NO.search(reply)
    if found is None:
        raise JudgeParseError(f"no yes or no in the judge's reply {reply[:80]!r}")
    return 1.0 if found.group(1).lower() == "yes" else 0.0


JUDGE_PARSERS: dict[str, Parser] = {"score_0_10": score_0_10, "yes_no": yes_no}


def regex_parser(pattern: str) -> Parser:
    """A parser reading the first group (or the whole match) of `pattern`'s first match as a number."""
    compiled = re.compile(pattern)

    def parse(reply: str) -> float:
        found = compiled.search(reply)
        if found is None:
            raise JudgeParseError(f"reward.judge.parser does not match the reply {reply[:80]!r}")
        text = found.group(1) if compiled.groups else found.group(0)
        try:
            return float(text)
        except ValueError:
            raise JudgeParseError(f"the parser's match {text!r} is not a number") from None

    return parse


def resolve_parser(spec: str) -> Parser:
    """A built-in parser name or a regular expression -> the parser; JudgeConfigError for a bad regex."""
    if spec in JUDGE_PARSERS:
        return JUDGE_PARSERS[spec]
    try:
        return regex_parser(spec)
    except re.error as err:
        raise JudgeConfigError(
            f"reward.judge.parser={spec!r}: neither a built-in parser ({', '.join(JUDGE_PARSERS)}) nor a "
            f"regular expression ({err}); fix the pattern or name a built-in."
        ) from err


def render_template(template: str, prompt: str, response: str, answer: str) -> str:
    """`template` with {prompt}, {response} and {answer} filled in (other braces left as they are)."""
    fields = {"{prompt}": prompt, "{response}": response, "{answer}": answer}
    pattern = re.compile("|".join(re.escape(k) for k in fields))
    return pattern.sub(lambda m: fields[m.group(0)], template)


def check_template(template: str) -> None:
    """Raise JudgeConfigError unless `template` shows the judge the response."""
    if "{response}" not in template:
        raise JudgeConfigError(
            f"reward.judge.template={template[:60]!r}: it never shows the response; put {{response}} "
            "(and {prompt}, {answer} as needed) in it."
        )


def judgement_key(prompt: str, response: str, answer: str) -> str:
    """The cache key of one judgement: a hash of the three texts it depends on."""
    digest = hashlib.sha256()
    for part in (prompt, response, answer):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


class JudgementCache:
    """The scores of past judgements by key, the least recently used dropped past `size` (0: no cache);
    `hits` and `lookups` count since the last `take_hit_rate`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._scores: OrderedDict[str, float] = OrderedDict()
        self.hits = self.lookups = 0

    def get(self, key: str) -> float | None:
        self.lookups += 1
        score = self._scores.get(key)
        if score is not None:
            self.hits += 1
            self._scores.move_to_end(key)
        return score

    def put(self, key: str, score: float) -> None:
        if self.size <= 0:
            return
        self._scores[key] = score
        self._scores.move_to_end(key)
        while len(self._scores) > self.size:
            self._scores.popitem(last=False)

    def take_hit_rate(self) -> float:
        """Hits over lookups since the last call (0.0 without lookups); the counts start over."""
        rate = self.hits / self.lookups if self.lookups else 0.0
        self.hits = self.lookups = 0
        return rate

    def __len__(self) -> int:
        return len(self._scores)
