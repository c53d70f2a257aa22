"""SimVectorEnvs: a batch's simulator episodes stepped together, as the runner drives them."""

from __future__ import annotations

from ascent.envs import make_env, run_episodes
from ascent.envs.sim import SimVectorEnvs
from ascent.messages import Generation, SamplingParams

ROWS = [{"gym_id": "CartPole-v1", "seed": s, "max_steps": 4, "env": "gym"} for s in (5, 5, 6)]


def test_vector_episodes_match_single_environments_step_for_step():
    vec = SimVectorEnvs()
    starts = vec.reset(ROWS)
    singles = [make_env("gym") for _ in ROWS]
    assert [s[0] for s in starts] == [e.reset(r) for e, r in zip(singles, ROWS, strict=True)]
    assert starts[0] == starts[1] != starts[2]  # a group's seed: the same start
    for action in ["<a0>", "<a1>", "<a1>"]:
        calls = [(i, action) for i in range(3)]
        assert vec.step(calls) == [e.step(action) for e in singles]
    vec.close()


def test_a_bad_action_ends_only_its_episode_and_the_others_go_on():
    vec = SimVectorEnvs()
    vec.reset(ROWS)
    out = vec.step([(0, "<a1>"), (1, "nothing"), (2, "<a0>")])
    assert not out[0].done and out[1].done and out[1].info["invalid_action"] and not out[2].done
    later = vec.step([(0, "<a1>"), (2, "<a0>")])  # episode 1 is over: stepped with a placeholder, dropped
    assert [r.info["episode_length"] for r in later] == [2, 2]


def test_episodes_that_end_at_different_steps_leave_the_others_running():
    rows = [{**ROWS[0], "seed": s, "max_steps": 100} for s in (5, 6, 7, 8)]
    vec, singles = SimVectorEnvs(), [make_env("gym") for _ in rows]
    vec.reset(rows)
    for e, r in zip(singles, rows, strict=True):
        e.reset(r)
    open_, lengths = set(range(4)), {}
    while open_:  # always push right: the poles fall at different steps
        calls = [(i, "<a1>") for i in sorted(open_)]
        for (i, _), got in zip(calls, vec.step(calls), strict=True):
            assert got == singles[i].step("<a1>")
            if got.done:
                open_.discard(i)
                lengths[i] = got.info["episode_length"]
    assert len(set(lengths.values())) > 1


def test_a_bad_row_costs_its_reset_only():
    out = SimVectorEnvs().reset([ROWS[0], {"seed": 1}])
    assert isinstance(out[0], tuple) and "gym_id" in out[1]


def test_a_failing_simulator_costs_its_block_not_the_batch(monkeypatch):
    vec = SimVectorEnvs()
    vec.reset([ROWS[0], {**ROWS[0], "gym_id": "Pendulum-v1", "bins": 8}])

    def broken(actions):
        raise RuntimeError("physics exploded")

    monkeypatch.setattr(vec.blocks[0], "step", broken)
    out = vec.step([(0, "<a1>"), (1, "<a3>")])
    assert out[0] == "RuntimeError: physics exploded" and not isinstance(out[1], str)


class FakeChat:
    """Token ids are characters (enough for the runner's bookkeeping)."""

    def prompt_ids(self, messages, tools=None):
        return [ord(c) for c in messages[0]["content"][:8]]

    def continuation_ids(self, messages):
        return [ord(c) for c in messages[0]["content"][:4]]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_the_runner_drives_vector_envs_and_records_success_and_length():
    def generate(requests):
        return [[Generation([ord(c) for c in "<a1>"], [0.0] * 4, "stop")] for _ in requests]

    from ascent.envs import Task

    tasks = [Task("gym", row, k) for k, row in enumerate(ROWS)]
    params = SamplingParams(max_new_tokens=4)
    eps = run_episodes(
        tasks, generate, FakeChat(), params, max_turns=10, max_tokens=500, envs=SimVectorEnvs()
    )
    assert [e.metadata["episode_length"] for e in eps] == [4, 4, 4]
    assert all(e.metadata["success"] for e in eps) and [e.reward for e in eps] == [4.0] * 3
