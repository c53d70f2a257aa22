"""Episodes from an agent's recorded calls (`ascent.orchestrator.agent_segments`): a call whose prompt
extends an earlier call's ids continues its episode; one that does not starts a segment of its own; the cuts
at max_turns / max_tokens; the ids between turns get mask 0, logprob 0 and the version of the turn before;
the tokens a grammar forced get mask 0."""

from __future__ import annotations

import itertools

import pytest

from ascent.envs.openai_agents import AgentResult
from ascent.messages import FinishReason, ImageInput
from ascent.orchestrator.agent_segments import count_tool_calls, segment_episode, segments
from ascent.orchestrator.agents import AgentStats
from ascent.rollout.server import CompletionRecord
from ascent.rollout.server.tool_parsers import hermes

CLOCK = itertools.count()


def rec(
    prompt: list[int],
    response: list[int],
    version: int = 3,
    finish: FinishReason = "stop",
    at: tuple[float, float] | None = None,
    forced: list[bool] | None = None,
    images: tuple[ImageInput, ...] = (),
) -> CompletionRecord:
    """A recorded call; `at` = (started, completed), by default one after the other in creation order."""
    start = float(next(CLOCK)) if at is None else at[0]
    return CompletionRecord(
        session_id="s",
        completion_id="c",
        index=0,
        endpoint="chat",
        prompt_ids=prompt,
        response_ids=response,
        logprobs=[-0.5] * len(response),
        finish_reason=finish,
        policy_version=version,  # type: ignore[arg-type]
        response_text="t" * len(response),
        started=start,
        created=start + 0.5 if at is None else at[1],
        forced=forced or [],
        images=images,
    )


def decode(ids: list[int]) -> str:
    return ",".join(map(str, ids))


def test_calls_that_extend_each_other_make_one_episode() -> None:
    calls = [rec([1, 2], [5, 6]), rec([1, 2, 5, 6, 7, 8], [9], version=4)]
    (seg,) = segments(calls)
    e = segment_episode(seg, row_id=7, max_turns=4, max_tokens=100, decode=decode)
    assert e.prompt_ids == [1, 2] and e.response_ids == [5, 6, 7, 8, 9]
    assert e.loss_mask == [1, 1, 0, 0, 1] and e.sampler_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert e.token_versions == [3, 3, 3, 3, 4] and e.policy_version == 3
    assert e.metadata["turns"] == 2 and e.finish_reason == "stop" and e.row_id == 7


def test_tokens_a_grammar_forced_leave_the_loss_of_an_agent_episode() -> None:
    """As the env runner's turns (`Generation.loss_mask`): a call under `response_format` whose `{"` and `}`
    were the only tokens allowed trains on the choices only; a call without flags trains on every token."""
    json_call = rec([1, 2], [5, 6, 7, 8], forced=[True, False, False, True])
    free_call = rec([1, 2, 5, 6, 7, 8, 0], [9, 4])
    (seg,) = segments([json_call, free_call])
    e = segment_episode(seg, row_id=0, max_turns=4, max_tokens=100, decode=decode)
    assert e.response_ids == [5, 6, 7, 8, 0, 9, 4]
    assert e.loss_mask == [0, 1, 1, 0, 0, 1, 1]
    assert e.sampler_logprobs == [-0.5] * 4 + [0.0] + [-0.5] * 2  # logprobs kept: only the mask moves
    with pytest.raises(ValueError, match="forced has 1 flags for 2 tokens"):
        rec([1], [2, 3], forced=[True]).loss_mask()


def test_a_rewritten_history_starts_a_new_segment_and_forks_follow_their_own_reply() -> None:
    first, other = (
        rec([1, 2], [5, 6], at=(0, 1)),
        rec([1, 2], [5, 9], at=(0, 1)),
    )  # n=2: two replies, one call
    continue_other = rec([1, 2, 5, 9, 4], [8])  # the agent went on with the second reply
    rewritten = rec([1, 3, 3], [2])  # history changed: extends neither
    segs = segments([first, other, continue_other, rewritten])
    assert [len(s.records) for s in segs] == [1, 2, 1]
    assert segs[1].records == (other, continue_other) and segs[2].records == (rewritten,)
    assert [s.start for s in segs] == ["first", "parallel", "rewritten"]  # the n=2 replies ran side by side


def test_parallel_calls_assemble_the_same_whatever_order_they_finished() -> None:
    """M1; then A and B both extend M1, started together (A first), B finishing first; then C extends A. In
    every completion order: M1, A, C is one episode (A started first, so it continues M1), B a branch of its
    own (prompt: M1's ids, mask 0), counted as parallel. Matching in completion order gave M1 to B."""
    m1 = rec([1, 2], [5, 6], at=(0, 1))
    a = rec([1, 2, 5, 6, 7], [8, 8, 8], at=(2, 5))
    b = rec([1, 2, 5, 6, 9], [4], at=(2.1, 3))
    c = rec([1, 2, 5, 6, 7, 8, 8, 8, 3], [2], at=(6, 7))
    for order in itertools.permutations([m1, a, b, c]):
        segs = segments(order)
        assert [s.records for s in segs] == [(m1, a, c), (b,)], order
        assert [s.start for s in segs] == ["first", "parallel"]
    stats = AgentStats()
    stats.add(segments([m1, b, a, c]), AgentResult(reward=1.0))
    metrics = stats.metrics(max_failure_rate=0.0)
    assert metrics["agent/parallel_segments"] == 1.0 and metrics["agent/rewritten_segments"] == 0.0
    branch = segment_episode(segments([m1, b, a, c])[1], 0, max_turns=4, max_tokens=100, decode=decode)
    assert branch.prompt_ids == [1, 2, 5, 6, 9] and branch.response_ids == [4] and branch.loss_mask == [1]


def test_a_retry_after_the_first_branch_finished_is_a_rewrite_not_parallel() -> None:
    m1, a = rec([1, 2], [5, 6]), rec([1, 2, 5, 6, 7], [8])
    retry = rec([1, 2, 5, 6, 9], [4])  # extends M1 again, started after A had finished
    segs = segments([m1, a, retry])
    assert [s.records for s in segs] == [(m1, a), (retry,)] and segs[1].start == "rewritten"


def test_the_cut_at_max_turns_and_max_tokens() -> None:
    calls = [rec([1], [2]), rec([1, 2, 0], [3]), rec([1, 2, 0, 3, 0], [4])]
    (seg,) = segments(calls)
    by_turns = segment_episode(seg, 0, max_turns=2, max_tokens=100, decode=decode)
    assert by_turns.response_ids == [2, 0, 3] and by_turns.finish_reason == "length"
    by_tokens = segment_episode(seg, 0, max_turns=9, max_tokens=4, decode=decode)
    assert by_tokens.response_ids == [2, 0, 3] and by_tokens.metadata["turns"] == 2
    whole = segment_episode(seg, 0, max_turns=3, max_tokens=5, decode=decode)
    assert whole.response_ids == [2, 0, 3, 0, 4] and whole.finish_reason == "stop"
    assert whole.response_text == decode(whole.response_ids)


def test_an_agent_episode_counts_the_tool_calls_its_replies_wrote() -> None:
    """Read by the endpoint's parser (Hermes here): two calls in one reply, one in another, none in the
    answer; a malformed block is no call (the endpoint handed the agent text, not a call)."""
    call = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    replies = {1: call + call, 2: call, 3: "the answer is 4", 4: "<tool_call>{oops</tool_call>"}
    records = [rec([0], [k]) for k in replies]
    assert count_tool_calls(records, hermes, lambda ids: replies[ids[0]]) == 3
    assert count_tool_calls(records[2:], hermes, lambda ids: replies[ids[0]]) == 0


def test_an_agent_episode_shows_the_images_of_its_last_included_call() -> None:
    """An agent that sends images (content parts to the endpoint): each call's prompt shows every image so
    far, in order, so the episode carries the last call's images; a cut at max_turns takes the images of
    the last call it keeps, not of the calls cut off."""
    first, second = (ImageInput(None, (1, 2, 2), 1, f"d{k}", f"turn {k}") for k in (1, 2))
    calls = [rec([1, 2], [5], images=(first,)), rec([1, 2, 5, 7], [9], images=(first, second))]
    (seg,) = segments(calls)
    whole = segment_episode(seg, row_id=0, max_turns=4, max_tokens=100, decode=decode)
    assert whole.images == (first, second) and whole.response_ids == [5, 7, 9]
    cut = segment_episode(seg, row_id=0, max_turns=1, max_tokens=100, decode=decode)
    assert cut.images == (first,) and cut.response_ids == [5] and cut.finish_reason == "length"
