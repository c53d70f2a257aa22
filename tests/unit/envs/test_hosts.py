"""Environments on hosts, forkserver processes (`ProcessHosts`) or Ray actors (`RayHosts`, on a local Ray
cluster): state kept between turns, hosts reused across batches, and a hang, a crash or sys.exit costing
only episodes (the hung or crashed one, and the others its host held), never the batch or the caller; and
Ray actors running stateless calls (rewards, agents) under the same policy as processes (tests/unit/cluster)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
from ascent.envs import ChatTokens, Task, run_episodes
from ascent.envs.hosts import InlineHosts, drop, reset
from ascent.messages import Generation, GenerationRequest, SamplingParams
from ascent.models.tiny import make_char_tokenizer

HOSTILE = "tests.unit.envs.hostile"
KINDS = ["process", "ray"]


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> ChatTokens:
    return ChatTokens(make_char_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture
def make_hosts(request: pytest.FixtureRequest):
    """hosts(kind, n, timeout_s): `n` process hosts or Ray actors (half a CPU each), closed after the test."""
    made: list[Any] = []

    def hosts(kind: str, n: int, timeout_s: float, memory_mb: int = 0) -> Any:
        field = "rollout.env_memory_limit_mb"
        policy = IsolationPolicy(
            "environment", timeout_s, "rollout.env_timeout_s", memory_mb=memory_mb, memory_field=field
        )
        if kind == "process":
            made.append(ProcessHosts(n, policy))
        else:
            request.getfixturevalue("ray_cluster")
            from ascent.cluster.ray_hosts import RayHosts

            made.append(RayHosts(n, policy, cpus_per_host=0.5, start_timeout_s=60))
        return made[-1]

    yield hosts
    for h in made:
        h.close()


def answer_one(chat: ChatTokens):
    def generate(requests: list[GenerationRequest]) -> list[list[Generation]]:
        ids = chat._encode("1") + [chat.tok.eos_token_id]
        return [[Generation(ids, [-0.1] * len(ids), "stop")] for _ in requests]

    return generate


def run(chat: ChatTokens, envs: list[str], hosts: Any, turns: int = 3):
    row = {"turns": turns, "parent": os.getpid()}
    tasks = [Task(f"{HOSTILE}:{name}", row, i) for i, name in enumerate(envs)]
    return run_episodes(
        tasks,
        answer_one(chat),
        chat,
        SamplingParams(max_new_tokens=4),
        max_turns=5,
        max_tokens=100,
        hosts=hosts,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_state_lives_in_the_host_between_turns(chat: ChatTokens, make_hosts, kind: str) -> None:
    episodes = run(chat, ["Counter"] * 4, make_hosts(kind, 2, 30))
    assert [e.reward for e in episodes] == [3.5] * 4  # 3 turns counted, in another process (+0.5)
    assert all(e.finish_reason == "stop" and e.metadata["turns"] == 3 for e in episodes)


def test_inline_hosts_keep_the_environments_in_this_process(chat: ChatTokens) -> None:
    """rollout.env_isolation=inline: the same runner and commands, in the caller's process (no +0.5)."""
    assert [e.reward for e in run(chat, ["Counter"] * 2, InlineHosts())] == [3.0, 3.0]


@pytest.mark.parametrize("kind", KINDS)
def test_hosts_serve_batch_after_batch_and_forget_each(chat: ChatTokens, make_hosts, kind: str) -> None:
    """One host, three batches: the same process counts on (it is not restarted per batch) until a crash
    replaces it; a finished batch's environments are dropped from it."""
    hosts = make_hosts(kind, 1, 30)
    assert [e.reward for e in run(chat, ["Tally"] * 2, hosts)] == [1.0, 2.0]
    assert [e.reward for e in run(chat, ["Tally"] * 2, hosts)] == [3.0, 4.0]  # the same process
    (dropped,) = hosts.run([(0, ("drop", drop, (None,)))])  # no batch is named None: nothing left to drop
    assert dropped.value == 0
    run(chat, ["Crash"], hosts)
    assert [e.reward for e in run(chat, ["Tally"], hosts)] == [1.0]  # a fresh process after the crash


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("Hang", "timed out after 2 s (rollout.env_timeout_s"),
        ("Crash", "died"),
        ("Exit", "SystemExit: leaving"),
    ],
)
def test_a_misbehaving_environment_costs_episodes_not_the_batch(
    chat: ChatTokens, make_hosts, kind: str, bad: str, reason: str
) -> None:
    hosts = make_hosts(kind, 2, 2)
    t0 = time.monotonic()
    # episode 0 misbehaves in host 0; episode 1 shares host 0; episodes 2 and 3 live in host 1
    episodes = run(chat, [bad, "Counter", "Counter", "Counter"], hosts)
    assert time.monotonic() - t0 < 20
    assert episodes[0].finish_reason == "abort" and reason in episodes[0].metadata["env_error"]
    if bad == "Crash":
        died = {
            "process": "process died (exit code 3) while running step",
            "ray": "actor died (ActorDiedError",
        }[kind]
        assert died in episodes[0].metadata["env_error"]
    assert episodes[0].reward == 0.0
    assert [episodes[k].reward for k in (2, 3)] == [3.5, 3.5]  # the other host's episodes are untouched
    if bad == "Exit":  # the process lives on: its other episode too
        assert episodes[1].reward == 3.5
    else:  # the replaced process took episode 1's environment with it
        assert (
            episodes[1].finish_reason == "abort"
            and "lost when its process was replaced" in episodes[1].metadata["env_error"]
        )
    again = run(chat, ["Counter"] * 2, hosts)  # the replaced host serves the next batch
    assert [e.reward for e in again] == [3.5, 3.5]


@pytest.mark.parametrize("kind", KINDS)
def test_an_environment_past_its_memory_limit_costs_its_episode_and_the_host_serves_on(
    chat: ChatTokens, make_hosts, kind: str
) -> None:
    # before: nothing limited the memory of an environment's process (or a reward's): one that allocates
    # without end took the machine's memory, and the operating system's OOM killer picked what to end
    hosts = make_hosts(kind, 2, 30, memory_mb=1024)
    episodes = run(chat, ["Hog", "Counter", "Counter", "Counter"], hosts)
    error = episodes[0].metadata["env_error"]
    assert episodes[0].finish_reason == "abort" and error.startswith("MemoryError")
    assert error.endswith("(over the 1024 MiB each environment process may use: rollout.env_memory_limit_mb)")
    assert [e.reward for e in episodes[1:]] == [3.5] * 3  # its host lives on, with episode 1's environment


def test_hosts_need_environment_names(chat: ChatTokens, tmp_path: Path) -> None:
    from ascent.envs import GuessNumber

    hosts = ProcessHosts(1, IsolationPolicy("environment", 5, "rollout.env_timeout_s"))
    try:
        with pytest.raises(TypeError, match="must name its environment"):
            run_episodes(
                [Task(GuessNumber(), {"target": 1}, 0)],
                answer_one(chat),
                chat,
                SamplingParams(),
                max_turns=1,
                max_tokens=10,
                hosts=hosts,
            )
    finally:
        hosts.close()


def test_an_actor_that_cannot_be_replaced_ends_the_batch_and_the_actors_at_once(
    chat: ChatTokens, make_hosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed actor whose replacement cannot start (a lost node, no capacity) is an error that says so,
    and every actor goes with it: no later call waits behind work left on the others."""
    hosts = make_hosts("ray", 2, 30)

    def no_capacity(h: int) -> Any:
        raise RuntimeError("no node can hold it")

    monkeypatch.setattr(hosts, "_start", no_capacity)
    with pytest.raises(RuntimeError, match="no node can hold it"):
        run(chat, ["Crash", "Counter"], hosts)
    t0 = time.monotonic()
    assert [o.value for o in hosts.run([(1, ("drop", drop, (None,)))])] == [0]  # nothing left to drop
    with pytest.raises(RuntimeError, match="environment actors were closed"):
        hosts.run([(1, ("reset", reset, (None, "Counter", {})))])
    assert time.monotonic() - t0 < 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_host_that_exits_with_status_0_is_noticed_at_once(chat: ChatTokens, make_hosts, kind: str) -> None:
    """No timeout ends it: a missed death would wait 120 s, and the test's own timeout (60 s) fails it."""
    episodes = run(chat, ["QuietExit", "Counter"], make_hosts(kind, 2, 120))
    died = {"process": "process died (exit code 0) while running step", "ray": "actor died"}[kind]
    assert episodes[0].finish_reason == "abort" and died in episodes[0].metadata["env_error"]
    assert episodes[1].reward == 3.5


def test_an_answer_that_cannot_travel_costs_its_episode_only(chat: ChatTokens, make_hosts) -> None:
    episodes = run(chat, ["Unsendable", "Counter"], make_hosts("process", 1, 30))
    assert episodes[0].finish_reason == "abort"
    assert "its answer to step cannot be sent back" in episodes[0].metadata["env_error"]
    assert episodes[1].reward == 3.5  # the same process serves on


def test_ray_actor_hosts_run_the_same_calls_under_the_same_policy(ray_cluster):
    """The stateless calls of rewards and agents on Ray actors: the contract and the texts of processes."""
    from ascent.cluster.ray_hosts import RayHosts
    from tests.unit.cluster.test_hosts import misbehave

    hosts = RayHosts(
        2, IsolationPolicy("reward", 1.0, "reward.timeout_s"), cpus_per_host=0.5, start_timeout_s=60
    )
    try:
        out = hosts.map(misbehave, ["a", "raise", "exit", "b"])  # (timeouts on actors: the Hang test above)
        assert [o.value for o in out if o.ok] == ["aa", "bb"]
        assert [o.error for o in out[1:3]] == ["ValueError: bad item", "SystemExit: 3"]
        assert [o.value for o in hosts.each(misbehave, ["c", "d"])] == ["cc", "dd"]
    finally:
        hosts.close()


class ResetsTo:
    """An environment whose reset returns `value` (not always the list of messages it must)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def reset(self, row: Any) -> Any:
        return self.value

    def step(self, action: str) -> Any:
        raise AssertionError("not reached")


@pytest.mark.parametrize("value", [42, None, "What is 2+2?", [{"role": "user", "content": "hi"}, "oops"]])
def test_a_reset_that_returns_no_messages_says_what_it_returned(value: Any) -> None:
    # before: "row 1: its prompt's images: TypeError: 'int' object is not iterable"
    with pytest.raises(TypeError, match=r"ResetsTo.reset returned .*; it must return the conversation"):
        reset({}, (0, 0), ResetsTo(value), {"prompt": "p"})
    messages = [{"role": "user", "content": "hi"}]
    assert reset({}, (0, 0), ResetsTo(messages), {}) == (messages, None)


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"role": "user"}, "has no 'content'; give it a string, or a list of content parts"),
        ({"role": "user", "content": None}, "has no 'content'"),
        ({"role": "user", "content": 7}, "has 'content' of type int"),
        ({"content": "hi"}, "has no 'role'"),
    ],
)
def test_a_reset_message_without_content_says_which(message: dict[str, Any], problem: str) -> None:
    # before: a message without content rendered as an empty turn, and the model trained on it silently
    value = [{"role": "system", "content": "be brief"}, message]
    with pytest.raises(TypeError, match=rf"ResetsTo.reset returned message 1 .*, which {problem}"):
        reset({}, (0, 0), ResetsTo(value), {"prompt": "p"})
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]
    assert reset({}, (0, 0), ResetsTo(calls), {})[0] == calls  # OpenAI's form: a call needs no content
