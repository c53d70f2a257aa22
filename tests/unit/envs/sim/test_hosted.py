"""HostedSimEnvs: blocks of simulator copies stepped by gymnasium's vector API inside host processes; a
simulator that kills its process costs its block's episodes and the host is replaced."""

from __future__ import annotations

import pytest

from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
from ascent.envs import Task, run_episodes
from ascent.envs.hosts import InlineHosts
from ascent.envs.sim import HostedSimEnvs, SimVectorEnvs
from ascent.messages import Generation, SamplingParams
from tests.unit.envs.sim.crashing import CRASH_SEED
from tests.unit.envs.sim.test_vector import ROWS, FakeChat

CRASH = "tests.unit.envs.sim.crashing:Crash-v0"


@pytest.fixture
def hosts():
    made = ProcessHosts(2, IsolationPolicy("environment", 60, "rollout.env_timeout_s"))
    yield made
    made.close()


def test_blocks_in_host_processes_step_like_one_vector_env(hosts):
    rows = ROWS + ROWS[:2]  # 5 episodes, blocks of 2: hosts 0, 1, 0
    here, there = SimVectorEnvs(), HostedSimEnvs(hosts, copies=2)
    assert there.reset(rows) == here.reset(rows)
    for action in ["<a0>", "<a1>", "bad", "<a1>"]:
        calls = [(i, action) for i in range(5) if i != 3 or action != "<a1>"]
        assert there.step(calls) == here.step(calls)
    there.close()
    assert hosts.run([(h, ("count", state_size, ())) for h in (0, 1)])[0].value == 0


def state_size(state):
    """A host command: how many entries the host's state still holds (0 after the batch was dropped)."""
    return len(state)


def test_a_simulator_that_kills_its_process_costs_its_block_and_the_host_is_replaced(hosts):
    rows = [{"gym_id": CRASH, "env": "gym", "seed": s} for s in (1, 2, 3, CRASH_SEED)]
    envs = HostedSimEnvs(hosts, copies=2)  # block 0 (seeds 1, 2) on host 0, block 1 on host 1
    assert all(isinstance(out, tuple) for out in envs.reset(rows))
    before = hosts.pids()
    out = envs.step([(i, "<a1>") for i in range(4)])
    assert [r.info["episode_length"] for r in out[:2]] == [1, 1]
    assert out[2] == out[3] == "its process died (exit code 3) while running step"
    after = hosts.pids()
    assert after[0] == before[0] and after[1] != before[1]
    again = envs.step([(0, "<a1>"), (1, "<a0>"), (2, "<a1>")])  # block 0 goes on; block 1 went
    assert [r.info["episode_length"] for r in again[:2]] == [2, 2] and "lost" in again[2]
    envs.close()
    fresh = HostedSimEnvs(hosts, copies=2)  # the replaced host serves the next batch
    fresh.reset(rows[:2] + rows[:2])
    assert [r.reward for r in fresh.step([(i, "<a0>") for i in range(4)])] == [1.0] * 4


def test_the_runner_records_the_crash_as_its_episodes_env_error(hosts):
    rows = [{"gym_id": CRASH, "env": "gym", "seed": s} for s in (1, CRASH_SEED)]

    def generate(requests):
        return [[Generation([ord(c) for c in "<a1>"], [0.0] * 4, "stop")] for _ in requests]

    tasks = [Task("gym", row, k) for k, row in enumerate(rows)]
    eps = run_episodes(
        tasks,
        generate,
        FakeChat(),
        SamplingParams(max_new_tokens=4),
        max_turns=3,
        max_tokens=500,
        envs=HostedSimEnvs(hosts, copies=1),
    )
    assert "env_error" not in eps[0].metadata and eps[0].reward == 3.0
    assert "died" in eps[1].metadata["env_error"] and eps[1].reward == 0.0


def test_inline_hosts_step_the_blocks_in_this_process():
    envs = HostedSimEnvs(InlineHosts(), copies=3)
    assert len(envs.reset(ROWS)) == 3 and not any(isinstance(r, str) for r in envs.step([(0, "<a1>")]))
