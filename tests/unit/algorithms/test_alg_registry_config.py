"""`resolve` (names and import paths) and the algorithm section of the config: names and rules."""

import pytest

from ascent.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    ppo_loss,
)
from ascent.algorithms.kl import kl_k1
from ascent.config import rules
from ascent.config.choices import ADVANTAGE_CHOICES, POLICY_LOSS_CHOICES
from ascent.config.schema import AlgorithmConfig, RunConfig
from ascent.plugins import resolve


def test_resolve_names_and_import_paths():
    assert resolve(POLICY_LOSSES, "ppo") is ppo_loss
    assert resolve(KL_ESTIMATORS, "ascent.algorithms.kl:kl_k1") is kl_k1
    with pytest.raises(ValueError, match="cispo, clip_cov, dro, gmpo, gspo, kl_cov, ppo, reinforce, sapo"):
        resolve(POLICY_LOSSES, "ppo2")
    with pytest.raises(ValueError, match="no module 'no_such_pkg_xyz'"):
        resolve(POLICY_LOSSES, "no_such_pkg_xyz.mod:fn")
    with pytest.raises(ValueError, match="no attribute"):
        resolve(POLICY_LOSSES, "ascent.algorithms.kl:nope")
    with pytest.raises(ValueError, match="not callable"):
        resolve(POLICY_LOSSES, "ascent.algorithms.kl:K3_MAX")


def test_config_name_sets_match_registries():
    assert set(ADVANTAGE_ESTIMATORS) == rules.ADVANTAGE_ESTIMATORS == set(ADVANTAGE_CHOICES)
    assert set(POLICY_LOSSES) == set(POLICY_LOSS_CHOICES)
    assert set(LOSS_AGGREGATIONS) == rules.LOSS_AGGREGATIONS
    assert set(KL_ESTIMATORS) == rules.KL_ESTIMATORS


def test_each_function_gets_only_the_settings_it_names_and_each_is_a_config_field():
    """`options_for` hands an estimator or loss only its own parameters; every parameter a built-in names is a
    field of its choice's member or a shared AlgorithmConfig field, and every field of its member is one of
    its parameters, so renaming a field cannot silently stop it reaching its function (the way the Dr. GRPO
    divisor once got lost)."""
    import torch

    from ascent.algorithms import AdvantageInputs, option_names, options_for

    inp = AdvantageInputs(
        torch.tensor([1.0, 0.0]),
        torch.ones(2, 2),
        torch.tensor([0, 0]),
        values=torch.zeros(2, 2),
        baseline_rewards=torch.zeros(2),
        teacher_logprobs=torch.zeros(2, 2),
        sampler_logprobs=torch.zeros(2, 2),
        old_logprobs=torch.zeros(2, 2),
        sum_pi_squared=torch.ones(2, 2),
    )
    x = torch.zeros(3)
    for field, registry in (("advantage", ADVANTAGE_ESTIMATORS), ("policy_loss", POLICY_LOSSES)):
        for name, fn in registry.items():
            cfg = AlgorithmConfig(**{field: name})
            choice = getattr(cfg, field)
            own, names = set(type(choice).model_fields) - {"name"}, option_names(fn)
            assert names is not None and own <= names, (name, own - (names or set()))
            assert names - own <= set(AlgorithmConfig.model_fields), (name, names - own)
            opts = options_for(fn, cfg.settings_for(choice))
            assert set(opts) == names
            if field == "advantage":
                fn(inp, **opts)
            else:
                fn(x, x, x, torch.ones(3), torch.zeros(3, dtype=torch.long), **opts)
    cfg = AlgorithmConfig()
    assert options_for(POLICY_LOSSES["ppo"], cfg.settings_for(cfg.policy_loss) | {"gamma": 0.5}).keys() == {
        "clip_ratio_low",
        "clip_ratio_high",
        "dual_clip_c",
    }


def test_a_plugin_with_kwargs_gets_every_option_and_a_stray_option_is_named():
    from ascent.algorithms import option_names, options_for
    from ascent.orchestrator.preflight import unused_options

    def plugin(logprobs, old, adv, mask, seq_ids, *, my_temp=1.0, **kw):
        return logprobs

    def strict(logprobs, old, adv, mask, seq_ids, my_temp=1.0):
        return logprobs

    assert option_names(plugin) is None and options_for(plugin, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    assert option_names(strict) == {"my_temp"}
    algo = AlgorithmConfig(policy_loss="mypkg:strict", options={"my_temp": 0.7, "my_tmp": 0.7})
    (problem,) = unused_options(algo, ADVANTAGE_ESTIMATORS["grpo"], strict)
    assert problem.startswith("algorithm.options.my_tmp=0.7: neither advantage='grpo' nor policy_loss=")
    assert problem.endswith("the plug-in takes my_temp. Fix the name, or drop it.")  # no built-in's settings
    assert unused_options(algo, ADVANTAGE_ESTIMATORS["grpo"], plugin) == []
    builtins = AlgorithmConfig(options={"my_temp": 0.7})  # options reach plug-ins only
    (problem,) = unused_options(builtins, ADVANTAGE_ESTIMATORS["grpo"], POLICY_LOSSES["ppo"])
    assert "only a plug-in takes options" in problem


def problems(**algorithm):
    rollout = algorithm.pop("rollout", {})
    with pytest.raises(ValueError) as e:
        RunConfig(algorithm=algorithm, rollout=rollout, train={"trajectories_per_update": 8})
    return str(e.value)


def ok(**algorithm):
    rollout = algorithm.pop("rollout", {})
    RunConfig(algorithm=algorithm, rollout=rollout, train={"trajectories_per_update": 8})


def test_defaults_and_valid_combinations():
    ok()
    ok(advantage="gae")
    ok(advantage="gae", use_critic=True, value_clip=None)
    ok(advantage="reinforce_pp", kl_penalty_coef=0.01, kl_target=0.1, rollout={"samples_per_prompt": 1})
    ok(policy_loss="mypkg.losses:my_loss", advantage="mypkg.adv:fn", use_critic=True)
    ok(rollout_correction="mis", rollout_correction_threshold_low=0.5, rollout_correction_level="sequence")
    ok(dynamic_sampling=True, overlong_buffer=64, mask_truncated=True)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"advantage": "rloo", "rollout": {"samples_per_prompt": 1}}, "rollout.samples_per_prompt=1: RLOO"),
        (
            {"advantage": "reinforce_pp_baseline", "rollout": {"samples_per_prompt": 1}},
            "samples_per_prompt=1",
        ),
        (
            {"advantage": "gae", "use_critic": False},
            "algorithm.use_critic=false: advantage=gae needs a critic",
        ),
        ({"use_critic": True}, "algorithm.use_critic=true: advantage=grpo does not use a critic"),
        ({"advantage": "remax", "rollout": {"temperature": 0.0}}, "rollout.temperature=0: ReMax"),
        ({"advantage": "grpoo"}, "algorithm.advantage='grpoo': unknown"),
        ({"policy_loss": "ppo2"}, "algorithm.policy_loss='ppo2': unknown"),
        ({"loss_aggregation": "mean"}, "algorithm.loss_aggregation='mean': unknown"),
        ({"kl_estimator": "k4"}, "algorithm.kl_estimator='k4': unknown"),
        ({"kl_penalty_estimator": "k9"}, "algorithm.kl_penalty_estimator='k9': unknown"),
        ({"kl_penalty_coef": 0.1}, "algorithm.kl_penalty_coef=0.1: advantage=grpo ignores per-token rewards"),
        ({"advantage": "reinforce_pp", "kl_target": 0.1}, "algorithm.kl_target=0.1"),
        ({"policy_loss": "gspo", "dual_clip_c": 3.0}, "algorithm.dual_clip_c=3.0: only policy_loss=ppo"),
        (
            {"rollout_correction": "tis", "rollout_correction_threshold_low": 0.5},
            "only rollout_correction=mis",
        ),
        (
            {
                "rollout_correction": "mis",
                "rollout_correction_threshold": 2.0,
                "rollout_correction_threshold_low": 3.0,
            },
            "must be below rollout_correction_threshold=2.0",
        ),
        ({"std_over_batch": True, "scale_by_std": False}, "std_over_batch=true needs"),
        ({"overlong_buffer": 256}, "algorithm.overlong_buffer=256"),
        (
            {"dynamic_sampling": True, "advantage": "reinforce_pp", "rollout": {"samples_per_prompt": 1}},
            "dynamic sampling keeps groups",
        ),
        ({"advantage": "gae", "critic_warmup_iterations": 10}, "algorithm.critic_warmup_iterations=10"),
    ],
)
def test_rules_name_field_value_and_fix(kwargs, needle):
    assert needle in problems(**kwargs)


def test_all_problems_reported_at_once():
    text = problems(policy_loss="x", advantage="y")  # unknown choices: found before the rules run
    assert "algorithm.policy_loss='x'" in text and "algorithm.advantage='y'" in text
    text = problems(loss_aggregation="x", kl_estimator="z", overlong_buffer=256)
    assert "loss_aggregation" in text and "kl_estimator" in text and "overlong_buffer" in text
