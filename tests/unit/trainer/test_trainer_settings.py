"""`loss_settings_from_config`: the policy loss gets the settings of its choice, the same whether the config
writes them flat (the older form) or under `algorithm.policy_loss`."""

from __future__ import annotations

import pytest

from ascent.config import load_config
from ascent.trainer.settings import loss_settings_from_config


@pytest.mark.parametrize(
    ("overrides", "name", "opts"),
    [
        ([], "ppo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "dual_clip_c": None}),
        (  # DAPO's clip-higher with a dual clip, flat as in the examples
            ["algorithm.clip_ratio_high=0.28", "algorithm.dual_clip_c=3"],
            "ppo",
            {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip_c": 3.0},
        ),
        (
            ["algorithm.policy_loss={name: ppo, clip_ratio_high: 0.28, dual_clip_c: 3}"],
            "ppo",
            {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "dual_clip_c": 3.0},
        ),
        (["algorithm.policy_loss=gspo"], "gspo", {"gspo_clip_low": 3e-4, "gspo_clip_high": 4e-4}),
        (
            ["algorithm.policy_loss=gspo", "algorithm.policy_loss.gspo_clip_low=1e-3"],
            "gspo",
            {"gspo_clip_low": 1e-3, "gspo_clip_high": 4e-4},
        ),
        (["algorithm.policy_loss=sapo"], "sapo", {"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05}),
        (["algorithm.policy_loss=reinforce"], "reinforce", {}),
    ],
)
def test_the_loss_gets_its_choices_settings(overrides: list[str], name: str, opts: dict) -> None:
    settings = loss_settings_from_config(load_config(None, overrides).algorithm, max_new_tokens=8)
    assert (settings.policy_loss, settings.loss_opts) == (name, opts)


def test_a_plugin_loss_gets_the_options_and_shared_settings_it_names() -> None:
    path = "tests.unit.trainer.test_trainer_settings:_plugin_loss"
    algo = load_config(None, [f"algorithm.policy_loss={path}", "algorithm.options={temp: 0.5}"]).algorithm
    settings = loss_settings_from_config(algo)
    assert (settings.policy_loss, settings.loss_opts) == (path, {"temp": 0.5, "adv_eps": 1e-6})


def _plugin_loss(logprobs, old, adv, mask, seq_ids, *, temp=1.0, adv_eps=0.0, clip_ratio_low=0.0):  # type: ignore[no-untyped-def]
    return logprobs, {}
