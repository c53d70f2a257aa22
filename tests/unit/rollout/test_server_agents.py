"""Agents played against the server (`ascent.envs.openai_agents.play`): each episode's calls are recorded
under its session, rewards come back, and an agent that raises, hangs, returns nonsense or kills its process
costs its own episodes only, in agent processes with a timeout; calls an agent makes in parallel assemble
into the same episode whatever order they finish in."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
from ascent.envs.openai_agents import AgentJob, AgentLoadError, AgentSpec, load_agent, play
from ascent.messages import GenerationRequest
from ascent.rollout.server import OpenAIServer
from tests.unit.rollout.server_support import (
    API_PROCESSES,
    EOS,
    KEY,
    ScriptedEngine,
    ShortFirstEngine,
    serving,
)

AGENTS = "tests.unit.rollout.scripted_agents"


@pytest.fixture(scope="module", params=API_PROCESSES, ids=lambda n: f"api_processes={n}")
def server(chat_model: Path, request: pytest.FixtureRequest) -> Iterator[OpenAIServer]:
    def reply(request: GenerationRequest) -> list[int]:
        return [request.prompt_ids[-4], EOS]

    with serving(ScriptedEngine(reply), chat_model, any_model=True, api_processes=request.param) as srv:
        yield srv


def spec(server: OpenAIServer, name: str, timeout_s: float = 20) -> AgentSpec:
    assert server.url is not None
    return AgentSpec(f"{AGENTS}:{name}", server.url, KEY, "policy", timeout_s)


def test_episodes_are_recorded_under_their_sessions(server: OpenAIServer) -> None:
    jobs = [AgentJob("a1", {"q": "hi"}), AgentJob("a2", {"q": "yo", "bonus": 1}), AgentJob("p1", {"q": "x"})]
    results = play(spec(server, "polite"), jobs[:2]) + play(spec(server, "plain"), jobs[2:])
    assert [(r.reward, r.error) for r in results] == [(1.0, None), (2.0, None), (None, None)]
    for job in jobs:
        (record,) = server.take(job.session)
        assert record.response_ids[-1] == EOS and record.prompt_ids


def test_failures_cost_their_episode_only(server: OpenAIServer) -> None:
    for name, error in [
        ("raises", "ValueError: no answer for hi"),
        ("nonsense", "TypeError: run(client, row) returned 'yes'"),
        ("hangs", "timed out after 0.5 s (rollout.source.timeout_s)"),
    ]:
        (result,) = play(spec(server, name, timeout_s=0.5), [AgentJob("f", {"q": "hi"})])
        assert result.reward is None and result.error is not None and result.error.startswith(error), name


def test_a_process_that_dies_costs_its_chunk_and_a_blocked_loop_is_interrupted(server: OpenAIServer) -> None:
    runner = ProcessHosts(2, IsolationPolicy("agent", 5, "rollout.source.timeout_s"))
    try:
        chunks = [[AgentJob("d", {"q": "a"})], [AgentJob("b", {"q": "b"})], [AgentJob("ok", {"q": "c"})]]
        names = ["dies", "blocks", "polite"]
        outcomes = [
            runner.each(partial(play, spec(server, n, timeout_s=2)), [c])[0]
            for n, c in zip(names, chunks, strict=True)
        ]
    finally:
        runner.close()
    assert "died (exit code 3)" in str(outcomes[0].error)
    assert outcomes[1].ok and "AgentBlockedError" in str(outcomes[1].value[0].error)  # before the kill at 5 s
    assert outcomes[2].ok and outcomes[2].value[0].reward == 1.0


@pytest.mark.parametrize(
    "path", ["nocolon", f"{AGENTS}:missing", "no.such.module:run", f"{AGENTS}:NOT_A_FUNCTION"]
)
def test_a_bad_agent_path_names_the_field(path: str) -> None:
    with pytest.raises(AgentLoadError, match=r"rollout.source.agent="):
        load_agent(path)


@pytest.mark.parametrize("api_processes", API_PROCESSES)
def test_parallel_calls_assemble_by_start_not_by_finish(chat_model: Path, api_processes: int) -> None:
    """`in_parallel` asks, then sends a `long` and a `short` follow-up at once, then goes on from `long`. The
    engine answers the short one first (continuous batching), so the server records it first. The episode
    is still the first call, `long` and the call after it (`long` started first and continues the first
    call); `short` is a branch of its own, counted in agent/parallel_segments."""
    from ascent.models.loading import load_tokenizer
    from ascent.orchestrator.agent_segments import segments
    from ascent.orchestrator.agents import AgentStats

    (g,) = load_tokenizer(chat_model).encode("g", add_special_tokens=False)

    def reply(request: GenerationRequest) -> list[int]:  # the last character of the last message, repeated
        last = request.prompt_ids[-4]
        return [last] * (6 if last == g else 1) + [EOS]  # "long" ends in g: a longer reply

    engine = ShortFirstEngine(reply, gather_s=1.0)
    with serving(engine, chat_model, any_model=True, api_processes=api_processes) as srv:
        (result,) = play(spec(srv, "in_parallel"), [AgentJob("par", {"q": "hi"})])
        records = srv.take("par")
    assert result.error is None and len(records) == 4
    first, short, long, after = records  # in the order they finished: short before long
    assert len(short.response_ids) == 2 and len(long.response_ids) == 7 and short.started > long.started
    segs = segments(records)
    assert [s.records for s in segs] == [(first, long, after), (short,)]
    assert [s.start for s in segs] == ["first", "parallel"]
    stats = AgentStats()
    stats.add(segs, result)
    assert stats.metrics(max_failure_rate=0.0)["agent/parallel_segments"] == 1.0
