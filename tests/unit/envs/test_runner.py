"""Multi-turn episodes: token-exactness (what the engine generated plus the observation ids, masks aligned),
the ends of an episode (done, max_turns, token budget, a turn cut by length), an environment that raises
costing only its episode, and the real reference engine driven turn by turn."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ascent.envs import ChatTokens, GuessNumber, StepResult, Task, make_env, run_episodes
from ascent.envs.base import EnvNotFoundError
from ascent.messages import Generation, GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.models.loading import load_tokenizer

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_envs"), seed=3)


@pytest.fixture(scope="module")
def chat(tiny_path: Path) -> ChatTokens:
    return ChatTokens(load_tokenizer(tiny_path))


class ScriptedEngine:
    """Answers request i of each call with the next guess of row i's script (its text + end of turn), and
    records every request."""

    def __init__(self, chat: ChatTokens, scripts: dict[int, list[str]], cut: bool = False) -> None:
        self.chat, self.scripts, self.cut, self.seen = chat, scripts, cut, []
        self.turn = {row: 0 for row in scripts}

    def __call__(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        self.seen.append(requests)
        out = []
        for r in requests:
            row = int(str(r.session_id).removeprefix("row").split(".")[0])
            text = self.scripts[row][self.turn[row]]
            self.turn[row] += 1
            ids = self.chat._encode(text) + [self.chat.tok.eos_token_id]
            if self.cut:
                ids = ids[: r.params.max_new_tokens]
            finish = "stop" if ids[-1] == self.chat.tok.eos_token_id else "length"
            out.append([Generation(ids, [-0.25] * len(ids), finish, [5] * len(ids))])
        return out


def tasks(*targets: int) -> list[Task]:
    return [Task(GuessNumber(), {"target": t}, row_id=i) for i, t in enumerate(targets)]


def test_an_episode_is_the_generated_tokens_plus_the_observation_ids(chat: ChatTokens) -> None:
    engine = ScriptedEngine(chat, {0: ["3", "9", "7"], 1: ["5"]})
    ep0, ep1 = run_episodes(tasks(7, 5), engine, chat, PARAMS, max_turns=5, max_tokens=200)
    assert (ep0.reward, ep0.finish_reason, ep0.metadata["turns"]) == (1.0, "stop", 3)
    assert ep0.metadata["turn_rewards"] == [0.0, 0.0, 1.0] and ep1.reward == 1.0
    assert [len(call) for call in engine.seen] == [2, 1, 1]  # one engine call per turn, open episodes only
    # each request was the episode so far, and the episode ends with the last turn's tokens
    last = engine.seen[-1][0]
    eos = chat.tok.eos_token_id
    higher, lower = (chat.continuation_ids([{"role": "user", "content": h}]) for h in ("higher", "lower"))
    guess = [chat._encode(g) + [eos] for g in ("3", "9", "7")]
    assert ep0.response_ids == guess[0] + higher + guess[1] + lower + guess[2]
    assert ep0.loss_mask == [1] * 2 + [0] * len(higher) + [1] * 2 + [0] * len(lower) + [1] * 2
    assert last.prompt_ids == ep0.prompt_ids + guess[0] + higher + guess[1] + lower
    assert ep0.prompt_ids == chat.prompt_ids(GuessNumber().reset({"target": 7}))
    sampled = [lp for lp, m in zip(ep0.sampler_logprobs, ep0.loss_mask, strict=True) if m]
    assert sampled == [-0.25] * 6 and all(
        lp == 0.0 for lp, m in zip(ep0.sampler_logprobs, ep0.loss_mask, strict=True) if not m
    )
    assert ep0.token_versions == [5] * len(ep0.response_ids) and ep0.policy_version == 5
    assert "higher" in chat.decode(higher)
    assert higher[-3:] == ep0.prompt_ids[-3:]  # an observation ends with the next generation prompt


def test_each_episode_keeps_its_session_and_request_id_over_turns(chat: ChatTokens) -> None:
    engine = ScriptedEngine(chat, {0: ["5"], 1: ["3", "9", "7"], 2: ["1", "8"]})
    run_episodes(tasks(5, 7, 8), engine, chat, PARAMS, max_turns=5, max_tokens=200)
    ids = [[(r.request_id, r.session_id) for r in call] for call in engine.seen]
    assert ids[0] == [(0, "row0.0"), (1, "row1.1"), (2, "row2.2")]
    assert ids[1:] == [
        [(1, "row1.1"), (2, "row2.2")],
        [(1, "row1.1")],
    ]  # episode 0 ended: the others keep theirs


def test_max_turns_and_the_token_budget_end_an_episode(chat: ChatTokens) -> None:
    ep = run_episodes(
        tasks(7), ScriptedEngine(chat, {0: ["1", "2", "7"]}), chat, PARAMS, max_turns=2, max_tokens=200
    )[0]
    assert (ep.finish_reason, ep.reward, ep.metadata["turns"]) == ("length", 0.0, 2)
    assert ep.loss_mask[-1] == 1  # it ends on the model's turn: the last observation is not appended
    tight = run_episodes(
        tasks(7), ScriptedEngine(chat, {0: ["1", "2"]}), chat, PARAMS, max_turns=5, max_tokens=8
    )[0]
    assert tight.finish_reason == "length" and len(tight.response_ids) <= 8
    cut = run_episodes(
        tasks(7), ScriptedEngine(chat, {0: ["1234567"]}, cut=True), chat, PARAMS, max_turns=5, max_tokens=200
    )[0]
    assert cut.finish_reason == "length" and cut.response_ids == chat._encode("1234")  # cut at max_new_tokens


class Flaky(GuessNumber):
    def step(self, action: str) -> StepResult:
        raise RuntimeError("the tool crashed")


def test_an_environment_that_raises_costs_only_its_episode(chat: ChatTokens) -> None:
    batch = [Task(Flaky(), {"target": 1}, row_id=0), Task(GuessNumber(), {"target": 2}, row_id=1)]
    bad, good = run_episodes(
        batch, ScriptedEngine(chat, {0: ["1"], 1: ["0", "2"]}), chat, PARAMS, max_turns=4, max_tokens=200
    )
    assert bad.finish_reason == "abort" and bad.reward == 0.0
    assert bad.metadata["env_error"] == "RuntimeError: the tool crashed"
    assert good.reward == 1.0 and good.metadata["turns"] == 2


class Calls(GuessNumber):
    """Guess the number; a turn that guesses reports one tool call per digit it wrote."""

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        return StepResult(result.observation, result.reward, result.done, {"tool_calls": len(action)})


def test_the_tool_calls_of_the_turns_add_up_in_the_metadata(chat: ChatTokens) -> None:
    """`info["tool_calls"]` of every turn, the last included, summed; an environment reporting none: 0."""
    batch = [Task(Calls(), {"target": 7}, row_id=0), Task(GuessNumber(), {"target": 5}, row_id=1)]
    engine = ScriptedEngine(chat, {0: ["33", "9", "7"], 1: ["1", "5"]})
    called, plain = run_episodes(batch, engine, chat, PARAMS, max_turns=5, max_tokens=200)
    assert called.metadata["tool_calls"] == 2 + 1 + 1 and called.metadata["turns"] == 3
    assert plain.metadata["tool_calls"] == 0 and plain.metadata["turns"] == 2
    # GuessNumber's info numbers (its `guesses`), latest value; Calls reports only tool_calls: no env_info
    assert plain.metadata["env_info"] == {"guesses": 2.0} and "env_info" not in called.metadata


def test_the_registry_and_import_paths() -> None:
    assert isinstance(make_env("guess_number"), GuessNumber)
    assert isinstance(make_env("ascent.envs.base:GuessNumber"), GuessNumber)
    with pytest.raises(EnvNotFoundError, match="guess_number"):
        make_env("guess_numbr")
    with pytest.raises(EnvNotFoundError, match="no module .no_such_module_xyz.. Python looked"):
        make_env("no_such_module_xyz:Env")


def test_the_reference_engine_runs_episodes_turn_by_turn(tiny_path: Path, chat: ChatTokens) -> None:
    from ascent.rollout import build_engine

    engine: Any = build_engine(
        "reference", model_path=tiny_path, device="cpu", eos_token_ids=[chat.tok.eos_token_id], pad_token_id=0
    )
    # every ordinary token ends a turn, so the random model plays several one-token turns
    one_token = SamplingParams(max_new_tokens=4, seed=0, stop_token_ids=tuple(range(4, len(chat.tok))))
    episodes = run_episodes(tasks(3, 8, 5, 1), engine.generate, chat, one_token, max_turns=3, max_tokens=40)
    assert max(ep.metadata["turns"] for ep in episodes) >= 2
    hints = [
        chat.continuation_ids([{"role": "user", "content": h}]) for h in ("higher", "lower", "not a number")
    ]
    for ep in episodes:
        n = len(ep.response_ids)
        assert len(ep.loss_mask) == len(ep.sampler_logprobs) == len(ep.token_versions) == n <= 40
        spans, start = [], None  # the mask-0 runs must each be one observation's ids
        for i, m in enumerate([*ep.loss_mask, 1]):
            if m == 0 and start is None:
                start = i
            elif m == 1 and start is not None:
                spans.append(ep.response_ids[start:i])
                start = None
        assert all(span in hints for span in spans)
        assert len(spans) == ep.metadata["turns"] - 1  # one observation between two model turns
        assert all(lp <= 0.0 for lp in ep.sampler_logprobs)


class BadAnswer:
    """Answers its first turn with `row["answer"]`: each breaks the StepResult contract a different way."""

    def reset(self, row: dict[str, Any]) -> list[dict[str, str]]:
        self.answer = row["answer"]
        return [{"role": "user", "content": "go"}]

    def step(self, action: str) -> Any:
        return self.answer


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            StepResult(reward=float("nan"), done=True),
            "StepResultError: BadAnswer.step returned reward=nan (float); it must",
        ),
        (StepResult(reward=float("inf")), "reward=inf (float); it must be a finite number"),
        (
            StepResult(reward=None, done=True),  # type: ignore[arg-type]
            "reward=None (NoneType); it must be a finite number",
        ),
        (
            StepResult(reward="1", done=True),  # type: ignore[arg-type]
            "reward='1' (str); it must be a finite number",
        ),
        (StepResult(done="yes"), "done='yes' (str); it must be True or False"),  # type: ignore[arg-type]
        (
            StepResult(observation="hi"),  # type: ignore[arg-type]
            "observation='hi' (str); it must be a tuple of messages",
        ),
        (
            StepResult(observation=({"role": "user"},)),
            "BadAnswer.step returned observation[0]={'role': 'user'} (dict), which has no 'content'; give "
            "it a string, or a list of content parts",
        ),
        (
            StepResult(observation=({"role": "tool", "content": "ok"}, {"role": "user", "content": None})),
            "observation[1]={'role': 'user', 'content': None} (dict), which has no 'content'",
        ),
        (
            StepResult(observation=({"role": "user", "content": 3},)),
            "observation[0]={'role': 'user', 'content': 3} (dict), which has 'content' of type int",
        ),
        (StepResult(observation=("hi",)), "observation[0]='hi' (str), which is a str, not a message"),
        (StepResult(info=[1]), "info=[1] (list); it must be a dict"),  # type: ignore[arg-type]
        (StepResult(info={"tool_calls": -1}), "info['tool_calls']=-1 (int); it must be a whole number >= 0"),
        (StepResult(info={"tool_calls": True}), "info['tool_calls']=True (bool); it must be a whole number"),
        ((["obs"], 1.0, True, {}), "step returned (['obs'], 1.0, True, {}) (tuple), not a StepResult"),
    ],
)
def test_a_broken_step_result_costs_its_episode_with_the_reason(
    chat: ChatTokens, answer: Any, reason: str
) -> None:
    tasks = [Task(BadAnswer(), {"answer": answer}, row_id=0), Task(GuessNumber(), {"target": 3}, row_id=1)]
    bad, good = run_episodes(
        tasks, ScriptedEngine(chat, {0: ["1"], 1: ["3"]}), chat, PARAMS, max_turns=2, max_tokens=200
    )
    assert bad.finish_reason == "abort" and bad.reward == 0.0 and reason in bad.metadata["env_error"]
    assert good.finish_reason == "stop" and good.reward == 1.0  # the batch goes on


class RoutingEngine(ScriptedEngine):
    """The scripted engine, recording MoE routes as the reference engine does: one row per request token and
    generated token ([tokens, 1 layer, k=1]), the turn number + 1 as the expert, -1 on the last token."""

    def __call__(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        import torch

        out = super().__call__(requests)
        for r, gens in zip(requests, out, strict=True):
            n = len(r.prompt_ids) + len(gens[0].token_ids)
            routes = torch.full((n, 1, 1), len(self.seen), dtype=torch.int16)
            routes[-1] = -1
            gens[0] = dataclasses.replace(gens[0], routed_experts=routes)
        return out


def test_an_moe_episode_keeps_each_tokens_first_recorded_experts(chat: ChatTokens) -> None:
    (ep,) = run_episodes(
        tasks(7), RoutingEngine(chat, {0: ["3", "7"]}), chat, PARAMS, max_turns=5, max_tokens=200
    )
    routes = ep.routed_experts[:, 0, 0].tolist()
    assert len(routes) == ep.num_tokens
    first = len(ep.prompt_ids) + 1  # the prompt and turn 1's first token: turn 1's forwards computed them
    assert routes[:first] == [1] * first
    assert routes[first:-1] == [2] * (len(routes) - first - 1)  # turn 1's last token, the observation, turn 2
    assert routes[-1] == -1  # the last sampled token went into no forward


def test_turn_grammars_give_each_turn_its_own_and_the_last_to_every_later_turn(chat: ChatTokens) -> None:
    engine = ScriptedEngine(chat, {0: ["3", "9", "8", "7"]})
    params = dataclasses.replace(PARAMS, grammar="first", turn_grammars=("first", "second"))
    run_episodes(tasks(7), engine, chat, params, max_turns=5, max_tokens=200)
    sent = [call[0].params for call in engine.seen]
    assert [p.grammar for p in sent] == ["first", "second", "second", "second"]
    assert all(p.turn_grammars == () for p in sent)  # an engine reads `grammar` alone
