"""A run's agent endpoint and agent processes (`ascent.orchestrator.agents.AgentService`), on a scripted
engine: an episode that outgrows the context ends truncated, never failed, whatever the agent does with the
endpoint's 400; an agent that blocks its event loop is stopped at its own timeout (the watchdog), not at the
process's, and costs its episode only; a batch without a single call stops with a sentence naming the fix."""

from __future__ import annotations

import gc
import multiprocessing
import socket
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ascent.messages import SamplingParams
from ascent.models.loading import load_tokenizer
from ascent.orchestrator.agents import AgentCallError, AgentService, AgentSetup, AgentStats, play_agent_groups
from tests.unit.rollout.server_support import EOS, ScriptedEngine

AGENTS = "tests.unit.rollout.scripted_agents"
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4, n=1)


class Item:
    def __init__(self, row_id: int, q: str) -> None:
        self.row_id, self.metadata = row_id, {"q": q}


def make_service(chat_model: Path, agent: str) -> AgentService:
    """A service for the scripted agent `agent`, with a 2 s timeout and a 48-token context."""
    engine = ScriptedEngine(lambda r: [r.prompt_ids[-4], r.prompt_ids[-4], EOS])
    setup = AgentSetup(
        f"{AGENTS}:{agent}",
        timeout_s=2.0,
        concurrency=8,
        workers=1,
        inline=False,
        max_prompt_tokens=16,
        max_episode_tokens=32,
        max_new_tokens=4,
        max_turns=99,
    )
    return AgentService(setup, engine.generate, PARAMS, load_tokenizer(chat_model))


@pytest.fixture
def service(chat_model: Path, request: pytest.FixtureRequest) -> Iterator[AgentService]:
    """A service for the agent named by the test's parameter (`make_service`)."""
    svc = make_service(chat_model, request.param)
    try:
        yield svc
    finally:
        svc.close()


def decode(ids: list[int]) -> str:
    return ",".join(map(str, ids))


@pytest.mark.parametrize(
    ("service", "reward"),
    [("talks_on", 0.0), ("talks_on_then_scores", 0.25), ("plain_talks_on", 0.0)],
    indirect=["service"],
)
def test_an_episode_past_the_context_ends_truncated_not_failed(service: AgentService, reward: Any) -> None:
    groups, unscored, stats = play_agent_groups(service, [Item(0, "hi"), Item(1, "yo")], PARAMS, decode)
    episodes = [e for g in groups for e in g]
    assert len(episodes) == 2 and stats.errors == 0 and stats.truncated == 2 and stats.calls > 4
    assert all(e.finish_reason == "length" and "context length" in e.metadata["truncated"] for e in episodes)
    assert all("env_error" not in e.metadata and e.metadata["turns"] > 2 for e in episodes)
    assert unscored == [] and [e.reward for e in episodes] == [reward, reward]  # raised on it: 0
    metrics = stats.metrics(max_failure_rate=0.0)
    assert metrics["agent/truncated"] == 2.0 and metrics["agent/errors"] == 0.0


@pytest.mark.timeout(20)  # the process's kill alone would end it at 12 s, the old one (+60 s) at 62 s
@pytest.mark.parametrize("service", ["blocks_on_b"], indirect=True)
def test_an_agent_blocking_its_loop_is_stopped_at_its_timeout(service: AgentService) -> None:
    groups, _, stats = play_agent_groups(service, [Item(0, "a"), Item(1, "b"), Item(2, "c")], PARAMS, decode)
    rows = [g[0].row_id for g in groups]
    assert rows == [0, 2] and [g[0].reward for g in groups] == [
        1.0,
        1.0,
    ]  # the loop's others had finished: kept
    assert stats.errors == 1 and "AgentBlockedError" in str(stats.first_error)
    assert "rollout.source.timeout_s=2 s" in str(stats.first_error)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("service", ["plain_hangs"], indirect=True)
def test_a_plain_agent_that_hangs_times_out_and_is_left_behind(service: AgentService) -> None:
    groups, _, stats = play_agent_groups(service, [Item(0, "a")], PARAMS, decode)
    assert groups == [] and stats.errors == 1 and "timed out after 2 s" in str(stats.first_error)
    assert "agent process" not in str(stats.first_error)  # the process returned: it was not killed


def test_a_batch_without_a_call_names_the_fix() -> None:
    from ascent.envs.openai_agents import AgentResult

    failed, refused, silent = AgentStats(), AgentStats(), AgentStats()
    for _ in range(3):
        failed.add([], AgentResult(error="RuntimeError: before any call"))
        refused.add(
            [], AgentResult(reward=0.0, truncated="This model's maximum context length is 32 tokens.")
        )
        silent.add([], AgentResult(reward=1.0))
    for stats, words in [
        (
            failed,
            "every one failed before its first call (first: RuntimeError: before any "
            "call), whatever reward.max_failure_rate allows",
        ),
        (
            refused,
            "refused their first call, which does not fit the context of "
            "data.max_prompt_tokens + rollout.source.max_episode_tokens",
        ),
        (silent, "must generate with the client it is given"),
    ]:
        with pytest.raises(AgentCallError, match="none of 3 agent episodes left a call to train on") as err:
            stats.require_calls()
        assert words in str(err.value)
    assert failed.metrics(max_failure_rate=1.0)["agent/errors"] == 3.0  # counted, within the rate


def test_a_closed_service_leaves_no_thread_process_port_or_server_behind(chat_model: Path) -> None:
    """What a run's endpoint and agent processes start is stopped by `close` (a Python caller may run several
    trainings in one process), and nothing keeps the stopped server (its engine, and a model behind it)
    alive: FastAPI's module-level caches hold the route functions, which must not close over it."""
    threads = {t.ident for t in threading.enumerate()}
    children = set(multiprocessing.active_children())
    service = make_service(chat_model, "polite")
    try:
        groups, _, stats = play_agent_groups(service, [Item(0, "hi")], PARAMS, decode)
        assert stats.calls > 0 and stats.errors == 0
        assert {t.ident for t in threading.enumerate()} > threads  # the HTTP thread and the batcher ran
        assert set(multiprocessing.active_children()) > children  # and the agent process
    finally:
        service.close()
    url, server = urlsplit(service.spec.url), weakref.ref(service.server)
    assert {t.ident for t in threading.enumerate()} <= threads
    assert set(multiprocessing.active_children()) <= children
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((url.hostname, url.port), timeout=5).close()
    del service, groups
    gc.collect()
    assert server() is None
