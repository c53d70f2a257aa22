"""Training an agent through the run's own OpenAI-compatible endpoint (`rollout.agent`).

The run serves its policy (`AgentService`: an `OpenAIServer` whose engine is the rollout replicas, started on
first use on a free localhost port with a random key) and plays the user's agent on every row,
`samples_per_prompt` times, in agent processes (`ascent.envs.openai_agents`); each play is a session. What
the server generated for a session is recorded token-exact (prompt ids, sampled ids, sampler logprobs,
policy versions, when each call started and ended), and `segments` assembles the episode from those records
alone, nothing re-tokenized: a call whose prompt extends the ids of an earlier call (its prompt and reply)
continues that call's episode, the ids between them are the observation (loss mask 0). Calls are matched in
the order they started, each to the longest earlier call it extends, so the assembly does not depend on
the order calls completed in (an agent that runs calls in parallel, with asyncio.gather or a sub-agent, sees
short ones finish first). A call that extends none, or a second call continuing the same call (a branch),
starts a new segment, trained as an episode of its own with the same reward: `agent/parallel_segments`
counts those that started while another call of the episode was running (parallel calls),
`agent/rewritten_segments` the others (the agent rewrote its history). The server makes echoed replies
continue their exact ids (`threads.py`), so an agent loop that appends to its messages gives one segment.

The replicas sample as the run is configured, whatever a call asks: temperature, top_p, top_k, min_p and
the repetition penalty are the run's, `max_tokens` is capped at `rollout.max_new_tokens` (the trainer's
logprobs and the importance correction assume the run's sampling). An episode is cut at `rollout.max_turns`
calls or `rollout.max_episode_tokens` response tokens. Rewards come from `run` or, when it returns None,
from the reward function on the last reply; an agent that fails costs its episodes (reward 0, counted in
`env/errors` and bounded by `reward.max_failure_rate`).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from ascent.cluster.isolated import InlineRunner, IsolatedRunner, default_workers
from ascent.envs.openai_agents import AgentJob, AgentResult, AgentSpec, play
from ascent.errors import AscentError
from ascent.messages import Episode, Generation, GenerationRequest, Group, SamplingParams
from ascent.orchestrator import batch as B
from ascent.orchestrator.episodes import EnvFailureError
from ascent.orchestrator.workers import RolloutWorker
from ascent.rollout.server import CompletionRecord, Limits, OpenAIServer, ServerOptions

MODEL_NAME = "policy"
log = logging.getLogger("ascent")


class AgentCallError(AscentError):
    """The agent never called the run's endpoint, so there is nothing to train on."""


class ReplicaEngine:
    """The rollout replicas as the server's engine: a call's requests spread over them, sampled with the
    run's parameters (`params`, set by the collector: training or validation)."""

    def __init__(self, rollout: Any, params: SamplingParams) -> None:
        self.rollout, self.params = rollout, params

    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        requests = [
            replace(r, params=self._run_params(r.params), request_id=i) for i, r in enumerate(requests)
        ]
        shards = B.shard(requests, self.rollout.num_workers)
        return [g for r in self.rollout.call_split(RolloutWorker.generate, shards) for g in r.generations]

    def _run_params(self, asked: SamplingParams) -> SamplingParams:
        run = self.params
        return replace(run, max_new_tokens=min(asked.max_new_tokens, run.max_new_tokens), n=asked.n, seed=None,
                       stop_strings=asked.stop_strings + run.stop_strings)  # fmt: skip

    def update_weights(self, named_tensors: Any) -> None:
        raise RuntimeError("the replicas get weights from the run's transport, not through the endpoint")

    def sleep(self, release_weights: bool = False) -> None: ...

    def wake(self) -> None: ...


class AgentService:
    """The endpoint and the agent processes of a run (see the module docstring); `close()` stops both."""

    def __init__(self, cfg: Any, rollout: Any, tokenizer: Any) -> None:
        r = cfg.rollout
        self.engine = ReplicaEngine(rollout, B.sampling_params(r))
        limits = Limits(cfg.data.max_prompt_tokens + r.max_episode_tokens, len(tokenizer), r.max_new_tokens)
        key = secrets.token_urlsafe(16)
        options = ServerOptions(MODEL_NAME, limits, key, max_batch_requests=1024, any_model=True)
        self.server = OpenAIServer(self.engine, tokenizer, options)
        url = self.server.start("127.0.0.1", 0)
        self.spec = AgentSpec(r.agent, url, key, MODEL_NAME, r.agent_timeout_s)
        self.concurrency, self.inline = r.agent_concurrency, r.env_isolation == "inline"
        self.workers = default_workers(r.env_workers)
        self.runner: InlineRunner | IsolatedRunner = (
            InlineRunner() if self.inline
            else IsolatedRunner(self.workers, r.agent_timeout_s + 60, preload=[r.agent.partition(":")[0]])
        )  # fmt: skip
        self._sessions = itertools.count()
        self._lock = threading.Lock()

    def play(
        self, rows: Sequence[Any], n: int, params: SamplingParams
    ) -> list[list[tuple[AgentJob, AgentResult]]]:
        """Play `n` episodes of every row with `params` -> per row, its (job, result) pairs. One play at a
        time (validation waits for episodes played ahead): the replicas sample with this play's `params`."""
        with self._lock:
            return self._play(rows, n, params)

    def _play(
        self, rows: Sequence[Any], n: int, params: SamplingParams
    ) -> list[list[tuple[AgentJob, AgentResult]]]:
        self.engine.params = params
        jobs = [AgentJob(f"ep{next(self._sessions)}", row) for row in rows for _ in range(n)]
        results: list[AgentResult] = []
        for chunk, outcome in zip(*self._chunked(jobs), strict=True):
            results += (
                outcome.value
                if outcome.ok
                else [AgentResult(error=f"agent process: {outcome.error}")] * len(chunk)
            )
        pairs = list(zip(jobs, results, strict=True))
        return [pairs[i * n : (i + 1) * n] for i in range(len(rows))]

    def _chunked(self, jobs: list[AgentJob]) -> tuple[list[list[AgentJob]], list[Any]]:
        count = max(1, min(len(jobs), max(self.workers, -(-len(jobs) // self.concurrency))))
        chunks = [c for c in B.shard(jobs, count) if c]
        return chunks, self.runner.each(partial(play, self.spec), chunks)

    def take(self, session: str) -> list[CompletionRecord]:
        return self.server.take(session)

    def close(self) -> None:
        self.runner.close()
        self.server.stop()


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
    """Why `rec` starts a segment: the first call, one made while an earlier-started call still ran, or not."""
    if not earlier:
        return "first"
    return "parallel" if any(e.created > rec.started for e in earlier) else "rewritten"


def _ids(rec: CompletionRecord) -> list[int]:
    return [*rec.prompt_ids, *rec.response_ids]


def _extends(prompt: list[int], ids: list[int]) -> bool:
    return len(prompt) > len(ids) and prompt[: len(ids)] == ids


def segment_episode(seg: Segment, row_id: int, max_turns: int, max_tokens: int, decode: Any) -> Episode:
    """One segment as an episode: the first call's prompt, then model turns (mask 1, the sampler's logprobs
    and versions) and the ids between them (mask 0), cut at `max_turns` calls / `max_tokens` response tokens."""
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
        mask += [0] * len(obs) + [1] * len(rec.response_ids)
        lps += [0.0] * len(obs) + rec.logprobs
        versions += [versions[-1] if versions else rec.policy_version] * len(obs) + sampled
        finish, turns = rec.finish_reason, turns + 1
    return Episode(prompt_ids=list(first.prompt_ids), response_ids=ids, sampler_logprobs=lps, loss_mask=mask,
                   finish_reason=finish, row_id=row_id, policy_version=min(versions, default=0),
                   token_versions=versions, response_text=decode(ids),
                   metadata={"turns": turns, "final_text": seg.records[turns - 1].response_text})  # fmt: skip


def collect_agent_groups(
    ctx: Any, items: Sequence[Any], params: SamplingParams
) -> tuple[list[Group], AgentStats]:
    """`params.n` plays of the agent on every item -> one group per item with any recorded call, in order,
    rewards set (the agent's, or the reward function's on the last reply); and the plays' counts."""
    r, stats = ctx.cfg.rollout, AgentStats()
    if ctx.agents is None:
        ctx.agents = AgentService(ctx.cfg, ctx.rollout, ctx.data.tokenizer)
    played = ctx.agents.play([it.metadata for it in items], params.n, params)
    groups: list[list[Episode]] = []
    unscored: list[tuple[int, int]] = []
    for item, pairs in zip(items, played, strict=True):
        episodes: list[Episode] = []
        for job, result in pairs:
            if result.error is not None:
                log.warning("agent episode %s (row %d) failed: %s", job.session, item.row_id, result.error)
            segs = segments(ctx.agents.take(job.session))
            stats.add(segs, result)
            for seg in segs:
                e = segment_episode(seg, item.row_id, r.max_turns, r.max_episode_tokens, ctx.decode)
                e = replace(e, metadata={**item.metadata, **e.metadata, "session": job.session,
                                         "segments": len(segs)})  # fmt: skip
                if result.error is not None:
                    e = replace(e, finish_reason="abort", metadata={**e.metadata, "env_error": result.error})
                elif result.reward is None:
                    unscored.append((len(groups), len(episodes)))
                episodes.append(replace(e, reward=result.reward or 0.0))
        if episodes:
            groups.append(episodes)
    _score_last_replies(ctx, groups, unscored)
    return [Group(tuple(g)) for g in groups], stats


def _score_last_replies(ctx: Any, groups: list[list[Episode]], where: list[tuple[int, int]]) -> None:
    """Episodes whose agent returned None get the reward function's score of their last reply."""
    if not where:
        return
    from ascent.rewards import RewardInput

    episodes = [groups[g][k] for g, k in where]
    inputs = [RewardInput(prompt=ctx.decode(e.prompt_ids), response=e.metadata["final_text"],
                          response_ids=e.response_ids, metadata=e.metadata, row_id=e.row_id)
              for e in episodes]  # fmt: skip
    result = ctx.rewards.score(inputs)
    for (g, k), e, reward, parts in zip(where, episodes, result.rewards, result.components, strict=True):
        groups[g][k] = replace(e, reward=reward, reward_components=dict(parts))


@dataclass
class AgentStats:
    """Counts over the plays since the last `take()`: sessions, calls, extra segments (rewritten, parallel),
    errors, seconds."""

    sessions: int = 0
    calls: int = 0
    rewritten: int = 0
    parallel: int = 0
    errors: int = 0
    empty: int = 0
    seconds: float = 0.0

    def add(self, segs: Sequence[Segment], result: AgentResult) -> None:
        self.sessions += 1
        self.calls += sum(len(s.records) for s in segs)
        self.rewritten += sum(s.start == "rewritten" for s in segs)
        self.parallel += sum(s.start == "parallel" for s in segs)
        self.errors += result.error is not None
        self.empty += not segs
        self.seconds += result.seconds

    def metrics(self, max_failure_rate: float) -> dict[str, float]:
        """agent/* metrics; raises when more plays failed than `reward.max_failure_rate` allows, or when no
        play called the endpoint at all."""
        if self.sessions and self.empty == self.sessions and not self.errors:
            raise AgentCallError(
                f"rollout.agent: none of {self.sessions} agent episodes called the endpoint; run(client, row) "
                "must generate with the client it is given (client.chat.completions.create(model=..., "
                "messages=...)), whose calls are what the run trains on."
            )
        if self.errors > max_failure_rate * self.sessions:
            raise EnvFailureError(
                f"reward.max_failure_rate={max_failure_rate}: {self.errors} of {self.sessions} agent episodes "
                "failed (their errors are in the log and the experience store). Fix the agent, raise "
                "rollout.agent_timeout_s if they time out, or raise reward.max_failure_rate."
            )
        n = max(self.sessions, 1)
        return {"agent/calls_mean": self.calls / n, "agent/rewritten_segments": float(self.rewritten),
                "agent/parallel_segments": float(self.parallel), "agent/errors": float(self.errors),
                "agent/empty_sessions": float(self.empty), "agent/seconds_mean": self.seconds / n}  # fmt: skip
