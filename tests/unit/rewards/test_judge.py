"""The pure half of the LLM judge: parsers, the template, the judgement cache."""

from __future__ import annotations

import pytest

from ascent.rewards.judge import (
    JudgeConfigError,
    JudgementCache,
    JudgeParseError,
    check_template,
    judgement_key,
    render_template,
    resolve_parser,
    score_0_10,
    yes_no,
)


def test_score_0_10_reads_the_last_number_and_scales_it():
    assert score_0_10("Reasoning: step 1 is fine. Score: 7") == pytest.approx(0.7)
    assert score_0_10("10") == 1.0 and score_0_10("0.5/10 ... 3") == pytest.approx(0.3)
    with pytest.raises(JudgeParseError, match="no number"):
        score_0_10("excellent")
    with pytest.raises(JudgeParseError, match="outside 0..10"):
        score_0_10("Score: 11")


def test_yes_no_reads_the_first_word_of_either():
    assert yes_no("Yes, it is right. No doubt.") == 1.0
    assert yes_no("no; yes would be wrong") == 0.0
    with pytest.raises(JudgeParseError):
        yes_no("the answer is eyes-only, nope")  # neither word stands alone


def test_a_regex_parser_reads_its_group_or_whole_match():
    assert resolve_parser(r"<score>([-\d.]+)</score>")("so <score>-0.25</score>") == -0.25
    assert resolve_parser(r"\d+")("rated 42 of 100") == 42.0
    with pytest.raises(JudgeParseError, match="does not match"):
        resolve_parser(r"<score>(\d)</score>")("no tag")
    with pytest.raises(JudgeParseError, match="not a number"):
        resolve_parser(r"grade (\w)")("grade A")
    assert resolve_parser("yes_no") is yes_no
    with pytest.raises(JudgeConfigError, match="reward.judge.parser"):
        resolve_parser("(unclosed")


def test_the_template_fills_the_three_fields_and_leaves_other_braces():
    text = render_template('Q: {prompt} A: {response} gold: {answer} json: {"k": 1}', "2+2", "{answer}", "4")
    assert text == 'Q: 2+2 A: {answer} gold: 4 json: {"k": 1}'  # a response is never re-filled
    with pytest.raises(JudgeConfigError, match="response"):
        check_template("Q: {prompt}")


def test_the_cache_hits_repeats_counts_its_hit_rate_and_drops_the_oldest():
    cache = JudgementCache(size=2)
    a, b, c = (judgement_key("p", r, "") for r in "abc")
    assert judgement_key("p", "a", "") == a and judgement_key("pa", "", "") != a
    assert cache.get(a) is None
    cache.put(a, 0.5)
    cache.put(b, 1.0)
    assert cache.get(a) == 0.5  # a is now the most recently used
    cache.put(c, 0.0)  # so b goes
    assert cache.get(b) is None and cache.get(c) == 0.0 and len(cache) == 2
    assert cache.take_hit_rate() == pytest.approx(2 / 4)
    assert cache.take_hit_rate() == 0.0  # the counts started over
    off = JudgementCache(size=0)
    off.put(a, 1.0)
    assert off.get(a) is None
