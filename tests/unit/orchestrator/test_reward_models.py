"""Reward components beyond the function: the judge's scorer (cache, failures), the weighted sum in
`sampling.Scorer`, and where setup places a reward model and a judge's own engine."""

from __future__ import annotations

import pytest

from ascent.config import ConfigError, load_config
from ascent.config.schema import RunConfig
from ascent.messages import Episode, Generation, Group, Rollout, SamplingParams
from ascent.orchestrator.placement import demand, placed_groups
from ascent.orchestrator.reward_models import ComponentScores, JudgeScorer
from ascent.orchestrator.sampling import Scorer
from ascent.orchestrator.specs import judge_engine_spec
from ascent.rewards import RewardFailureError, RewardInput, RewardRunner
from ascent.rewards.judge import JudgementCache, resolve_parser


class CharTokenizer:
    """One token per character; the chat template is the message itself."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return messages[-1]["content"]

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class FakeEngine:
    """A rollout group whose replies are `reply(prompt text)`; it counts the prompts it was asked."""

    num_workers = 2

    def __init__(self, reply, finish=lambda text: "stop"):
        self.reply, self.finish, self.asked = reply, finish, []

    def call_split(self, method, shards):
        tok = CharTokenizer()
        out = []
        for shard in shards:
            texts = [tok.decode(r.prompt_ids) for r in shard]
            self.asked += texts
            gens = [
                [Generation(tok.encode(self.reply(t)), [0.0] * len(self.reply(t)), self.finish(t))]
                for t in texts
            ]
            out.append(Rollout(gens, 0, 0.0))
        return out


def judge(engine, max_failure_rate=0.5, cache_size=100):
    return JudgeScorer(
        engine,
        CharTokenizer(),
        "Q={prompt} R={response} A={answer}",
        resolve_parser("score_0_10"),
        SamplingParams(temperature=0.0, max_new_tokens=8, max_time_s=2.0),
        JudgementCache(cache_size),
        max_failure_rate,
    )


def inputs(*responses, answer="4"):
    return [RewardInput("2+2", r, [], {"answer": answer}, row_id=i) for i, r in enumerate(responses)]


def test_the_judge_scores_from_the_rendered_template_and_caches_repeats():
    engine = FakeEngine(lambda text: "score 8" if "R=4 " in text else "score 2")
    scorer = judge(engine)
    out = scorer.score(inputs("4", "5", "4"))
    assert out.scores == pytest.approx([0.8, 0.2, 0.8]) and out.failures == 0
    assert engine.asked[0] == "Q=2+2 R=4 A=4"
    assert out.metrics["reward/judge/mean"] == pytest.approx(0.6)
    again = scorer.score(inputs("5", "4"))
    assert again.scores == pytest.approx([0.2, 0.8])
    assert len(engine.asked) == 3  # the second batch was answered from the cache (the first asked thrice)
    assert again.metrics["reward/judge/cache_hit_rate"] == 1.0
    assert out.metrics["reward/judge/cache_hit_rate"] == 0.0  # in one batch repeats are asked together


def test_a_reply_that_does_not_parse_costs_its_sample_and_is_counted_and_not_cached():
    engine = FakeEngine(lambda text: "great" if "R=bad" in text else "7")
    scorer = judge(engine, max_failure_rate=0.5)
    out = scorer.score(inputs("bad", "ok", "ok", "fine"))
    assert out.scores == pytest.approx([0.0, 0.7, 0.7, 0.7]) and out.failures == 1
    assert out.metrics["reward/judge/failures"] == 1.0 and out.metrics["reward/judge/failure_rate"] == 0.25
    scorer.score(inputs("bad", "ok"))  # 1 of 2 failed: at the 0.5 limit, not over it
    assert engine.asked.count("Q=2+2 R=bad A=4") == 2  # a failure is asked again next time
    with pytest.raises(RewardFailureError, match="reward.judge"):
        judge(FakeEngine(lambda text: "?"), max_failure_rate=0.5).score(inputs("a", "b"))


def test_a_judgement_past_its_timeout_costs_its_sample_counted_logged_and_not_cached(caplog):
    # the engine ended the "slow" judgement as "abort" (SamplingParams.max_time_s): a number already written
    # does not count
    engine = FakeEngine(lambda text: "8", finish=lambda text: "abort" if "R=slow" in text else "stop")
    scorer = judge(engine, max_failure_rate=0.5)
    with caplog.at_level("WARNING", logger="ascent"):
        out = scorer.score(inputs("slow", "ok", "ok", "ok"))
    assert out.scores == pytest.approx([0.0, 0.8, 0.8, 0.8]) and out.failures == 1
    assert out.metrics["reward/judge/failures"] == 1.0
    assert "timed out after reward.judge.timeout_s=2.0 s" in caplog.text and "row 1" in caplog.text
    scorer.score(inputs("slow", "ok"))
    assert engine.asked.count("Q=2+2 R=slow A=4") == 2  # not cached: asked again
    with pytest.raises(RewardFailureError, match="timed out"):
        judge(FakeEngine(lambda text: "8", finish=lambda text: "abort")).score(inputs("a", "b"))


class Fixed:
    """A component scorer that gives every input the same score."""

    def __init__(self, name, weight, value):
        self.name, self.weight, self.value = name, weight, value

    def score(self, items):
        return ComponentScores([self.value] * len(items), 0, {f"reward/{self.name}/mean": self.value})


def groups_of(*responses):
    eps = [
        Episode([1], [2], [0.0], [1], "stop", 0, response_text=r, metadata={"answer": "4"}) for r in responses
    ]
    return [Group(tuple(eps))]


def test_the_scorer_weights_the_function_and_the_components_and_records_each():
    runner = RewardRunner("exact_match")
    scorer = Scorer(
        runner, lambda ids: "2+2", (Fixed("reward_model", 0.5, 2.0), Fixed("judge", 2.0, 0.25)), 3.0
    )
    groups, metrics = scorer(groups_of("4", "5"))
    eps = groups[0].episodes
    assert [e.reward for e in eps] == pytest.approx([3.0 + 1.0 + 0.5, 0.0 + 1.0 + 0.5])
    assert eps[0].reward_components == {"fn": 1.0, "reward_model": 2.0, "judge": 0.25}
    assert metrics["reward/fn/mean"] == 0.5 and metrics["reward/mean"] == pytest.approx(3.0)
    assert metrics["reward/reward_model/mean"] == 2.0 and metrics["reward/failures"] == 0.0
    plain = Scorer(runner, lambda ids: "2+2")(groups_of("4", "5"))[1]
    assert "reward/fn/mean" not in plain and plain["reward/mean"] == 0.5  # without components: as before


def test_fn_weight_zero_never_calls_the_function():
    class Boom(RewardRunner):
        def score(self, items):
            raise AssertionError("called")

    groups, metrics = Scorer(Boom("exact_match"), lambda ids: "", (Fixed("judge", 1.0, 0.5),), 0.0)(
        groups_of("4")
    )
    assert groups[0].episodes[0].reward == 0.5 and "reward/fn/mean" not in metrics


def config(**reward):
    return RunConfig.model_validate({"reward": reward, "model": {"path": "m"}})


def test_the_reward_model_is_placed_like_the_critic_and_a_judge_engine_adds_one_replica():
    assert placed_groups(config()) == 1 and placed_groups(config(model={"path": "rm"})) == 2
    ray = {"backend": "ray", "gpus_per_worker": 1.0, "num_trainer_workers": 2, "num_rollout_workers": 2}
    base = RunConfig.model_validate({"cluster": ray, "model": {"path": "m"}})
    with_rm = RunConfig.model_validate(
        {"cluster": ray, "model": {"path": "m"}, "reward": {"model": {"path": "r"}}}
    )
    assert demand(with_rm).gpus == demand(base).gpus == 2.0  # colocated: the same bundles, split three ways
    assert demand(with_rm).cpus == demand(base).cpus + 2.0
    judge_cfg = {"model": "/ckpt/judge", "template": "{response}"}
    with_judge = RunConfig.model_validate(
        {"cluster": ray, "model": {"path": "m"}, "reward": {"judge": judge_cfg}}
    )
    assert demand(with_judge).gpus == 3.0
    policy_judge = {"cluster": ray, "model": {"path": "m"}, "reward": {"judge": {"template": "{response}"}}}
    assert demand(RunConfig.model_validate(policy_judge)).gpus == 2.0  # the replicas judge


def test_the_config_refuses_a_judge_that_cannot_work_and_components_on_an_env_source():
    with pytest.raises(ValueError, match="never shows the response"):
        config(judge={"template": "{prompt}"})
    with pytest.raises(ValueError, match="regular expression"):
        config(judge={"template": "{response}", "parser": "(("})
    env = {"source": {"name": "env", "env": "pkg.mod:Env"}}
    with pytest.raises(ValueError, match="reward.model is set, but rollout.source=env"):
        RunConfig.model_validate({"model": {"path": "m"}, "rollout": env, "reward": {"model": {"path": "r"}}})


def pinned(model: str, *more: str) -> RunConfig:
    judge = f"reward.judge={{model: '{model}', template: '{{response}}'}}"
    return load_config(
        None, ["model.path=/m", "model.tokenizer_path=/tok", "iterations=5", judge, *more], RunConfig
    )


def test_policy_at_n_pins_a_version_and_bad_spellings_name_the_field_and_the_fix():
    cfg = pinned("policy@3")
    assert cfg.reward.judge is not None and cfg.reward.judge.pinned_version == 3
    assert pinned("policy@0").reward.judge.pinned_version == 0  # type: ignore[union-attr]
    assert pinned("policy").reward.judge.pinned_version is None  # type: ignore[union-attr]
    assert pinned("/ckpt/judge").reward.judge.pinned_version is None  # type: ignore[union-attr]
    spec = judge_engine_spec(cfg)  # an engine of its own, of the run's initial policy (and its tokenizer)
    assert spec is not None and (spec.model_path, spec.tokenizer_path) == ("/m", "/tok")
    for bad in ("policy@", "policy@-1", "policy@1.5", "policy@x", "policy@ 2"):
        with pytest.raises(ConfigError) as info:
            pinned(bad)
        assert info.value.exit_code == 2
        (problem,) = info.value.problems
        assert problem.startswith(f"reward.judge.model='{bad}': the version after 'policy@' must be a whole")
        assert "policy@0 for model.path" in problem
    with pytest.raises(ConfigError, match=r"policy@5: version 5 is published after iteration 5.*below 5"):
        pinned("policy@5")


def test_a_pinned_judge_has_an_engine_of_its_own():
    ray = ["cluster.backend=ray", "cluster.gpus_per_worker=1.0"]
    assert demand(pinned("policy@2", *ray)).gpus == demand(pinned("policy", *ray)).gpus + 1.0


def test_a_judge_of_its_own_runs_on_the_engine_the_config_names():
    assert judge_engine_spec(pinned("policy@2")).name == "reference"  # type: ignore[union-attr]
    fast = judge_engine_spec(
        pinned("policy@2", "reward.judge.engine=fast", "reward.judge.gpu_memory_fraction=0.3")
    )
    assert fast is not None and fast.name == "fast"
    assert (
        fast.builder_kwargs()["gpu_memory_fraction"] == 0.3
        and "generation_batch_size" not in fast.builder_kwargs()
    )
    with pytest.raises(ConfigError) as info:
        pinned("policy", "reward.judge.engine=fast")
    assert info.value.exit_code == 2 and "the rollout replicas judge, on rollout.engine" in str(info.value)
