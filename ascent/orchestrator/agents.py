"""Training an agent through the run's own OpenAI-compatible endpoint (an agent `rollout.source`;
`ascent eval --agent`).

The run serves its policy (`AgentService`: an `OpenAIServer` whose engine is the rollout replicas, started on
first use on a free localhost port with a random key) and plays the user's agent on every row,
`samples_per_prompt` times (`ascent.envs.openai_agents`) on hosts (`agent_hosts`: processes under the
isolation policy of `ascent.cluster.hosts`, or inline); each play is a session, whose
recorded calls `agent_segments.py` assembles into episodes.
An episode's `metadata["tool_calls"]` counts the tool calls its replies wrote (`AgentService.tool_calls`,
the endpoint's parser), as the environment path's do.

The replicas sample as the run is configured, whatever a call asks: temperature, top_p, top_k, min_p and
the repetition penalty are the run's, `max_tokens` is capped at `rollout.max_new_tokens` (the trainer's
logprobs and the importance correction assume the run's sampling). An episode is cut at
`rollout.source.max_turns` calls or `rollout.source.max_episode_tokens` response tokens. Rewards come from
`run` or, when it returns None, from the reward function on the last reply; an agent that fails costs its
episodes (reward 0, counted in `env/errors` and bounded by `reward.max_failure_rate`).

An episode that outgrows its budget ends as truncated, as the environment path's do: the endpoint refuses a
call past `data.max_prompt_tokens + rollout.source.max_episode_tokens` with OpenAI's 400
`context_length_exceeded`, the agent process notes it (whatever the agent then does), and the session's
episodes finish "length" (in `rollout/truncated_frac`, masked by `algorithm.mask_truncated`), reward 0 when
the agent raised on it, never an agent failure; `agent/truncated` counts them. A batch in which no episode
made a call stops the run with a sentence naming the fix: there is nothing to train on, whatever
`reward.max_failure_rate` allows.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ascent.cluster.base import WorkerGroup
from ascent.cluster.hosts import IsolationPolicy, ProcessHosts, default_workers
from ascent.config.schema import RunConfig
from ascent.config.sources import AgentSourceConfig
from ascent.data import image_codec
from ascent.envs.hosts import Hosts, InlineHosts
from ascent.envs.openai_agents import AgentJob, AgentResult, AgentSpec, play
from ascent.errors import AscentError
from ascent.messages import Episode, Generation, GenerationRequest, Group, SamplingParams
from ascent.models.vision import ImageCodec
from ascent.orchestrator import batch as B
from ascent.orchestrator.agent_segments import Segment, count_tool_calls, segment_episode, segments
from ascent.orchestrator.episodes import EnvFailureError
from ascent.orchestrator.sampling import Decode, Scorer
from ascent.orchestrator.workers import RolloutWorker
from ascent.rewards import RewardInput, RewardRunner
from ascent.rollout.server import CompletionRecord, Limits, ServerOptions

MODEL_NAME = "policy"
PROCESS_GRACE_S = 10.0  # an agent process's kill, past rollout.source.timeout_s (the watchdog acts first)
log = logging.getLogger("ascent")
Generate = Callable[[list[GenerationRequest]], list[list[Generation]]]


class AgentCallError(AscentError):
    """No agent episode of a batch called the run's endpoint, so there is nothing to train on."""


@dataclass(frozen=True)
class AgentSetup:
    """What the endpoint and the agent processes are built from (`rollout.*`, or `ascent eval --agent`)."""

    agent: str
    timeout_s: float
    concurrency: int
    workers: int | None
    inline: bool
    max_prompt_tokens: int
    max_episode_tokens: int
    max_new_tokens: int
    max_turns: int
    codec: ImageCodec | None = (
        None  # a vision-language model's: the endpoint takes image parts (None: refused)
    )
    memory_mb: int = 0  # an agent process's memory limit (rollout.env_memory_limit_mb; 0: none)

    @classmethod
    def of(cls, cfg: RunConfig) -> AgentSetup:
        """The setup of the run's agent source (`rollout.source: {name: agent, ...}`)."""
        r, source = cfg.rollout, cfg.rollout.source
        if not isinstance(source, AgentSourceConfig):
            raise ValueError(f"AgentSetup.of: the run's source is {source.name}, not agent")
        return cls(
            source.agent,
            source.timeout_s,
            source.concurrency,
            r.env_workers,
            r.env_isolation == "inline",
            cfg.data.max_prompt_tokens,
            source.max_episode_tokens,
            r.max_new_tokens,
            source.max_turns,
            image_codec(cfg.model.path, cfg.model.min_pixels, cfg.model.max_pixels),
            r.env_memory_limit_mb,
        )


def replica_generate(rollout: WorkerGroup[RolloutWorker]) -> Generate:
    """The rollout replicas (a worker group) as one `generate`: the requests spread over them."""

    def generate(requests: list[GenerationRequest]) -> list[list[Generation]]:
        shards = B.shard(requests, rollout.num_workers)
        return [g for r in rollout.call_split(RolloutWorker.generate, shards) for g in r.generations]

    return generate


class ReplicaEngine:
    """`generate` as the server's engine: a call's requests sampled with the run's parameters (`params`, set
    by the collector: training or validation)."""

    def __init__(self, generate: Generate, params: SamplingParams) -> None:
        self._generate, self.params = generate, params

    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        return self._generate(
            [replace(r, params=self._run_params(r.params), request_id=i) for i, r in enumerate(requests)]
        )

    def _run_params(self, asked: SamplingParams) -> SamplingParams:
        run = self.params
        return replace(
            run,
            max_new_tokens=min(asked.max_new_tokens, run.max_new_tokens),
            n=asked.n,
            seed=None,
            stop_strings=asked.stop_strings + run.stop_strings,
        )

    def update_weights(self, named_tensors: Any) -> None:
        raise RuntimeError("the replicas get weights from the run's transport, not through the endpoint")

    def sleep(self, release_weights: bool = False) -> None: ...

    def wake(self) -> None: ...


class AgentService:
    """The endpoint and the agent processes of a run (see the module docstring); `close()` stops both."""

    def __init__(self, setup: AgentSetup, generate: Generate, params: SamplingParams, tokenizer: Any) -> None:
        self.setup = setup
        self.engine = ReplicaEngine(generate, params)
        limits = Limits(
            setup.max_prompt_tokens + setup.max_episode_tokens, len(tokenizer), setup.max_new_tokens
        )
        key = secrets.token_urlsafe(16)
        options = ServerOptions(MODEL_NAME, limits, key, max_batch_requests=1024, any_model=True)
        from ascent.rollout.server import OpenAIServer  # deferred: FastAPI and uvicorn, for agent runs only

        self.server = OpenAIServer(self.engine, tokenizer, options, codec=setup.codec)
        url = self.server.start("127.0.0.1", 0)
        try:  # a service that fails to build leaves no server thread or port behind
            self.spec = AgentSpec(setup.agent, url, key, MODEL_NAME, setup.timeout_s)
            self.workers = default_workers(setup.workers)
            self.hosts = agent_hosts(setup, self.workers)
        except BaseException:
            self.server.stop()
            raise
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
        count = max(1, min(len(jobs), max(self.workers, -(-len(jobs) // self.setup.concurrency))))
        chunks = [c for c in B.shard(jobs, count) if c]
        return chunks, self.hosts.each(
            partial(play, self.spec), chunks, f"rollout.source.agent={self.setup.agent}"
        )

    def take(self, session: str) -> list[CompletionRecord]:
        return self.server.take(session)

    def tool_calls(self, records: Sequence[CompletionRecord]) -> int:
        """The tool calls written in `records`' replies, read by the endpoint's tool parser (the model
        family's format, as the agent was handed them)."""
        return count_tool_calls(records, self.server.tool_parser, self.server.tool_text)

    def close(self) -> None:
        """Stop the agent processes and the endpoint (its HTTP thread and batcher), whatever fails first."""
        try:
            self.hosts.close()
        finally:
            self.server.stop()


def agent_hosts(setup: AgentSetup, workers: int) -> Hosts:
    """The hosts of agent plays: processes under `rollout.source.timeout_s` (plus a grace: an episode's own
    watchdog acts first), or this process (`rollout.env_isolation=inline`)."""
    if setup.inline:
        return InlineHosts()
    policy = IsolationPolicy(
        "agent",
        setup.timeout_s + PROCESS_GRACE_S,
        "rollout.source.timeout_s",
        memory_mb=setup.memory_mb,
        memory_field="rollout.env_memory_limit_mb",
    )
    return ProcessHosts(workers, policy, preload=["openai", setup.agent.partition(":")[0]])


def play_agent_groups(
    service: AgentService, items: Sequence[Any], params: SamplingParams, decode: Decode
) -> tuple[list[list[Episode]], list[tuple[int, int]], AgentStats]:
    """`params.n` plays of the agent on every item -> per item with any recorded call, its episodes (rewards
    set from the agent; failed ones finish "abort", budget-truncated ones "length"); where the episodes whose
    agent returned None sit (group, index: the reward function scores their last reply); the plays' counts."""
    setup, stats = service.setup, AgentStats()
    played = service.play([it.metadata for it in items], params.n, params)
    groups: list[list[Episode]] = []
    unscored: list[tuple[int, int]] = []
    for item, pairs in zip(items, played, strict=True):
        episodes: list[Episode] = []
        for job, result in pairs:
            if result.error is not None:
                log.warning("agent episode %s (row %d) failed: %s", job.session, item.row_id, result.error)
            segs = segments(service.take(job.session))
            stats.add(segs, result)
            for seg in segs:
                e = segment_episode(seg, item.row_id, setup.max_turns, setup.max_episode_tokens, decode)
                calls = service.tool_calls(seg.records[: e.metadata["turns"]])
                meta = {"session": job.session, "segments": len(segs), "tool_calls": calls}
                e = replace(e, metadata={**item.metadata, **e.metadata, **meta})
                if result.error is not None:
                    e = replace(e, finish_reason="abort", metadata={**e.metadata, "env_error": result.error})
                elif result.truncated is not None:
                    e = replace(
                        e, finish_reason="length", metadata={**e.metadata, "truncated": result.truncated}
                    )
                if result.error is None and result.reward is None:
                    unscored.append((len(groups), len(episodes)))
                episodes.append(replace(e, reward=result.reward or 0.0))
        if episodes:
            groups.append(episodes)
    return groups, unscored, stats


class AgentPlays:
    """An agent `rollout.source` in the RL loop: its endpoint and agent processes (an `AgentService`), started
    on the first play, stopped by `close`; scores the plays whose agent returned None with the reward
    function."""

    def __init__(
        self, setup: AgentSetup, generate: Generate, params: SamplingParams, tokenizer: Any, scorer: Scorer
    ) -> None:
        self.setup, self.generate, self.params, self.tokenizer = setup, generate, params, tokenizer
        self.scorer = scorer
        self._service: AgentService | None = None

    def play(self, items: Sequence[Any], params: SamplingParams) -> tuple[list[Group], AgentStats]:
        """`params.n` plays of the agent on every item -> one group per item with any recorded call, in order,
        rewards set (the agent's, or the reward function's on the last reply); and the plays' counts."""
        if self._service is None:
            self._service = AgentService(self.setup, self.generate, self.params, self.tokenizer)
        decode = self.scorer.decode
        groups, unscored, stats = play_agent_groups(self._service, items, params, decode)
        stats.require_calls()
        score_last_replies(self.scorer.rewards, decode, groups, unscored)
        return [Group(tuple(g)) for g in groups], stats

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
            self._service = None


def score_last_replies(
    rewards: RewardRunner, decode: Decode, groups: list[list[Episode]], where: list[tuple[int, int]]
) -> None:
    """Episodes whose agent returned None get the reward function's (`rewards`, a RewardRunner) score of
    their last reply."""
    if not where:
        return

    episodes = [groups[g][k] for g, k in where]
    inputs = [
        RewardInput(
            prompt=decode(e.prompt_ids),
            response=e.metadata["final_text"],
            response_ids=e.response_ids,
            metadata=e.metadata,
            row_id=e.row_id,
        )
        for e in episodes
    ]
    result = rewards.score(inputs)
    for (g, k), e, reward, parts in zip(where, episodes, result.rewards, result.components, strict=True):
        groups[g][k] = replace(e, reward=reward, reward_components=dict(parts))


@dataclass
class AgentStats:
    """Counts over the plays since the last `take()`: sessions, calls, extra segments (rewritten, parallel),
    errors, sessions truncated by the budget, sessions without a call, seconds; the first error and the
    first refusal, quoted when nothing could be trained on."""

    sessions: int = 0
    calls: int = 0
    rewritten: int = 0
    parallel: int = 0
    errors: int = 0
    truncated: int = 0
    empty: int = 0
    seconds: float = 0.0
    first_error: str | None = None
    first_refusal: str | None = None

    def add(self, segs: Sequence[Segment], result: AgentResult) -> None:
        self.sessions += 1
        self.calls += sum(len(s.records) for s in segs)
        self.rewritten += sum(s.start == "rewritten" for s in segs)
        self.parallel += sum(s.start == "parallel" for s in segs)
        self.errors += result.error is not None
        self.truncated += result.truncated is not None
        self.empty += not segs
        self.seconds += result.seconds
        self.first_error = self.first_error or result.error
        self.first_refusal = self.first_refusal or result.truncated

    def require_calls(self) -> None:
        """Raise, naming the fix, when no play left a call (no episode to train on or to score)."""
        if self.sessions and self.empty == self.sessions:
            raise AgentCallError(self._nothing_to_train())

    def metrics(self, max_failure_rate: float) -> dict[str, float]:
        """agent/* metrics; raises when more plays failed than `reward.max_failure_rate` allows."""
        if self.errors > max_failure_rate * self.sessions:
            raise EnvFailureError(
                f"reward.max_failure_rate={max_failure_rate}: {self.errors} of {self.sessions} agent "
                "episodes "
                "failed (their errors are in the log and the experience store). Fix the agent, raise "
                "rollout.source.timeout_s if they time out, or raise reward.max_failure_rate."
            )
        n = max(self.sessions, 1)
        return {
            "agent/calls_mean": self.calls / n,
            "agent/rewritten_segments": float(self.rewritten),
            "agent/parallel_segments": float(self.parallel),
            "agent/errors": float(self.errors),
            "agent/truncated": float(self.truncated),
            "agent/empty_sessions": float(self.empty),
            "agent/seconds_mean": self.seconds / n,
        }

    def _nothing_to_train(self) -> str:
        head = f"rollout.source.agent: none of {self.sessions} agent episodes left a call to train on"
        if self.first_refusal is not None:
            return (
                f"{head}: the endpoint refused their first call, which does not fit the context of "
                f"data.max_prompt_tokens + rollout.source.max_episode_tokens ({self.first_refusal}). Raise "
                "those, or have the agent ask for fewer max_tokens (the run caps replies at "
                "rollout.max_new_tokens)."
            )
        if self.first_error is not None:
            return (
                f"{head}: every one failed before its first call (first: {self.first_error}), whatever "
                "reward.max_failure_rate allows. Fix the agent (its errors are in the log); raise "
                "rollout.source.timeout_s if they time out."
            )
        return (
            f"{head}; run(client, row) must generate with the client it is given "
            "(client.chat.completions.create(model=..., messages=...)), whose calls are what the run "
            "trains on."
        )
