"""An agent session's recorded calls -> episodes (an agent `rollout.source`; the endpoint records, `agents.py`
plays).

What the server generated for a session is recorded token-exact (prompt ids, sampled ids, sampler logprobs,
policy versions, when each call started and ended), and `segments` assembles the episode from those records
alone, nothing re-tokenized: a call whose prompt extends the ids of an earlier call (its prompt and reply)
continues that call's episode, the ids between them are the observation (loss mask 0), and so are the
sampled tokens a grammar forced (`response_format`, guided decoding: `CompletionRecord.loss_mask`). Calls are matched in
the order they started, each to the longest earlier call it extends, so the assembly does not depend on
the order calls completed in (an agent that runs calls in parallel, with asyncio.gather or a sub-agent, sees
short ones finish first). A call that extends none, or a second call continuing the same call (a branch),
starts a new segment, trained as an episode of its own with the same reward: `agent/parallel_segments`
counts those that started while another call of the episode was running (parallel calls),
`agent/rewritten_segments` the others (the agent rewrote its history). The server makes echoed replies
continue their exact ids (`threads.py`), so an agent loop that appends to its messages gives one segment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from ascent.messages import Episode
from ascent.rollout.server import CompletionRecord

SegmentStart = Literal["first", "parallel", "rewritten"]


@dataclass(frozen=True)
class Segment:
    """Calls of one session whose ids extend each other, oldest first; `start` says why it is a segment of its
    own: the session's first call, a call made while another was running, or a rewritten history."""

    records: tuple[CompletionRecord, ...]
    start: SegmentStart = "first"


def segments(records: Sequence[CompletionRecord]) -> list[Segment]:
    """A session's calls, in any order -> its segments (see the module doc). Calls are taken in the order they
    started (ties: as given); each continues the segment of the longest earlier call whose ids its prompt
    starts with, when that call ends its segment, and starts a new segment otherwise."""
    ordered = sorted(records, key=lambda r: r.started)
    out: list[Segment] = []
    tips: dict[int, int] = {}  # the call (position in `ordered`) that ends a segment -> that segment
    for k, rec in enumerate(ordered):
        parents = [j for j in range(k) if _extends(rec.prompt_ids, _ids(ordered[j]))]
        parent = max(parents, key=lambda j: len(_ids(ordered[j])), default=None)
        if parent is not None and parent in tips:
            seg = tips.pop(parent)
            out[seg] = replace(out[seg], records=(*out[seg].records, rec))
        else:
            seg = len(out)
            out.append(Segment((rec,), _why_new(rec, ordered[:k])))
        tips[k] = seg
    return out


def _why_new(rec: CompletionRecord, earlier: Sequence[CompletionRecord]) -> SegmentStart:
    """Why `rec` starts a segment: the first call, one made while an earlier-started call still ran,
    or not."""
    if not earlier:
        return "first"
    return "parallel" if any(e.created > rec.started for e in earlier) else "rewritten"


def _ids(rec: CompletionRecord) -> list[int]:
    return [*rec.prompt_ids, *rec.response_ids]


def _extends(prompt: list[int], ids: list[int]) -> bool:
    return len(prompt) > len(ids) and prompt[: len(ids)] == ids


def segment_episode(seg: Segment, row_id: int, max_turns: int, max_tokens: int, decode: Any) -> Episode:
    """One segment as an episode: the first call's prompt, then model turns (mask 1, 0 on the tokens a
    grammar forced as the env runner's turns; the sampler's logprobs and versions) and the ids between them
    (mask 0), cut at `max_turns` calls / `max_tokens` response tokens."""
    first = seg.records[0]
    ids, mask, lps, versions = [], [], [], []  # type: ignore[var-annotated]
    finish, turns = first.finish_reason, 0
    for rec in seg.records:
        obs = rec.prompt_ids[len(first.prompt_ids) + len(ids) :]
        if turns == max_turns or len(ids) + len(obs) + len(rec.response_ids) > max_tokens:
            finish = "length"
            break
        sampled = rec.token_versions or [rec.policy_version] * len(rec.response_ids)
        ids += obs + rec.response_ids
        mask += [0] * len(obs) + rec.loss_mask()
        lps += [0.0] * len(obs) + rec.logprobs
        versions += [versions[-1] if versions else rec.policy_version] * len(obs) + sampled
        finish, turns = rec.finish_reason, turns + 1
    return Episode(
        prompt_ids=list(first.prompt_ids),
        response_ids=ids,
        sampler_logprobs=lps,
        loss_mask=mask,
        finish_reason=finish,
        row_id=row_id,
        policy_version=min(versions, default=0),
        token_versions=versions,
        response_text=decode(ids),
        metadata={"turns": turns, "final_text": seg.records[turns - 1].response_text},
        images=seg.records[max(turns, 1) - 1].images,  # the last call's prompt shows them all, in order
    )


def count_tool_calls(
    records: Sequence[CompletionRecord], parse: Callable[[str], Any], text: Callable[[list[int]], str]
) -> int:
    """The tool calls written in `records`' replies: `text(ids)` is a reply's text as the endpoint's tool
    parser reads it, `parse(text)` that parser ((content, calls), or None for a reply without calls)."""
    parsed = [parse(text(list(r.response_ids))) for r in records]
    return sum(len(p[1]) for p in parsed if p is not None)
