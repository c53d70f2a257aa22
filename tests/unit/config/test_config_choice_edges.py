"""The edges of the policy-loss and advantage choices: `algorithm.options` holds a plug-in's own settings
only; an older version's resolved config.yaml (every setting flat) still loads; a plug-in's flat built-in
settings are refused; a choice's bare name as an override keeps the settings given; "did you mean" names
the choice a misspelt setting belongs to."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ascent.cli import app
from ascent.config import ConfigError, RunConfig, load_config
from ascent.config.choices import (
    CHOICE_FIELDS,
    CispoLoss,
    GrpoAdvantage,
    GspoLoss,
    PluginChoice,
    PpoLoss,
)
from ascent.config.nesting import LEGACY_FLAT
from ascent.config.schema import AlgorithmConfig

PLUGIN = "mypkg.losses:my_loss"


def refused(overrides: list[str], path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    return str(err.value)


def older_resolved(**algorithm) -> dict:
    """The `algorithm` section as versions before the choices wrote config.yaml: the choices as names and
    every setting of every loss and estimator flat beside them, at its default unless given."""
    out = RunConfig().model_dump(mode="json")["algorithm"]
    for field, (choices, default) in CHOICE_FIELDS.items():
        out[field] = default
        for member in choices.values():
            out |= {k: i.default for k, i in member.model_fields.items() if k != "name" and k not in out}
    assert all(key in out for keys in LEGACY_FLAT.values() for key in keys)
    return out | algorithm


def write(tmp_path: Path, algorithm: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"algorithm": algorithm}))
    return path


# ---------------------------------------------------------------- algorithm.options


def test_options_naming_a_builtin_setting_are_refused_with_the_field_to_use() -> None:
    assert refused(["algorithm.options.clip_ratio_high=0.5"]) == (
        "algorithm.options.clip_ratio_high=0.5: a setting of policy_loss=ppo; set "
        "algorithm.policy_loss.clip_ratio_high instead."
    )
    assert refused(["algorithm.options.adv_eps=0.01"]) == (
        "algorithm.options.adv_eps=0.01: a setting of algorithm itself; set algorithm.adv_eps instead."
    )
    text = refused(["algorithm.advantage=gae", "algorithm.options.gamma=0.9"])
    assert (
        text
        == "algorithm.options.gamma=0.9: a setting of advantage=gae; set algorithm.advantage.gamma instead."
    )


def test_options_meant_for_a_plugin_loss_cannot_reach_a_builtin_estimator() -> None:
    """`options.gamma` for a plug-in loss would have changed GAE's gamma, and reached grpo's neighbours."""
    assert "set algorithm.advantage.gamma instead" in refused(
        [f"algorithm.policy_loss={PLUGIN}", "algorithm.advantage=gae", "algorithm.options.gamma=0.9"]
    )
    assert refused([f"algorithm.policy_loss={PLUGIN}", "algorithm.options.gamma=0.9"]) == (
        "algorithm.options.gamma=0.9: a setting of advantage=reinforce_pp, reinforce_pp_baseline, remax or "
        "gae, and this run's advantage is grpo; algorithm.options holds a plug-in's own settings, under "
        "names no built-in setting uses: remove it, or set advantage: {name: reinforce_pp, gamma: 0.9}."
    )


def test_a_plugin_takes_a_builtin_settings_name_from_options_and_builtins_take_no_options() -> None:
    a = load_config(
        None, [f"algorithm.policy_loss={PLUGIN}", "algorithm.options={clip_ratio_high: 0.5, my_temp: 2}"]
    ).algorithm
    assert a.policy_loss == PluginChoice(name=PLUGIN)
    assert a.settings_for(a.policy_loss)["clip_ratio_high"] == 0.5
    assert "my_temp" not in a.settings_for(a.advantage)  # grpo is a built-in: its settings are its fields
    a = load_config(None, ["algorithm.advantage=my.adv:fn", "algorithm.options.gamma=0.9"]).algorithm
    assert a.settings_for(a.advantage)["gamma"] == 0.9 and "gamma" not in a.settings_for(a.policy_loss)


def test_config_show_refuses_options_that_would_override_a_builtin_setting() -> None:
    result = CliRunner().invoke(app, ["config", "show", "algorithm.options.clip_ratio_high=0.5"])
    assert result.exit_code == 2
    assert "set algorithm.policy_loss.clip_ratio_high instead" in result.output


# ---------------------------------------------------------------- older resolved config.yaml


def test_an_older_resolved_config_loads_and_warns_of_what_its_choice_does_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = older_resolved(clip_ratio_high=0.28, lam=0.95, gspo_clip_low=0.001)
    with caplog.at_level(logging.WARNING, logger="ascent"):
        a = load_config(write(tmp_path, old)).algorithm
    assert a.policy_loss == PpoLoss(clip_ratio_high=0.28) and a.advantage == GrpoAdvantage()
    assert [r.getMessage() for r in caplog.records] == [
        "algorithm: ignoring gspo_clip_low=0.001 (an older version's config.yaml, which lists every setting "
        "flat): this run's policy_loss is ppo, which does not read it.",
        "algorithm: ignoring lam=0.95 (an older version's config.yaml, which lists every setting flat): this "
        "run's advantage is grpo, which does not read it.",
    ]


def test_a_hand_written_config_with_an_unread_setting_is_still_refused(tmp_path: Path) -> None:
    old = older_resolved(lam=0.95)
    del old["gae_whiten"]  # not every flat setting of the advantage: written by hand
    assert "algorithm.lam=0.95: only advantage=gae reads it" in refused([], write(tmp_path, old))


def test_an_older_resolved_config_with_a_plugin_drops_the_builtin_settings_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ascent"):
        a = load_config(write(tmp_path, older_resolved(policy_loss=PLUGIN))).algorithm
    assert a.policy_loss == PluginChoice(name=PLUGIN)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("algorithm: ignoring clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip_c=null")
    assert warning.endswith(
        f"plug-in {PLUGIN!r}, which takes its settings from algorithm.options only; set "
        "algorithm.options.<key> for each it should get."
    )


# ---------------------------------------------------------------- a plug-in's flat built-in settings


@pytest.mark.parametrize("value", [0.2, 0.28])
def test_a_flat_builtin_setting_with_a_plugin_is_refused_at_any_value(value: float) -> None:
    """Before the choices a plug-in taking `clip_ratio_high` got ascent's value, even the default; silently
    dropping it would hand the plug-in its own default instead."""
    assert refused([f"algorithm.policy_loss={PLUGIN}", f"algorithm.clip_ratio_high={value}"]) == (
        f"algorithm.clip_ratio_high={value}: only policy_loss=ppo or clip_cov reads it, and this run's policy_loss is "
        f"the plug-in {PLUGIN!r}, whose settings go under algorithm.options; remove it or move it to "
        "algorithm.options.clip_ratio_high."
    )
    text = refused(["algorithm.advantage=my.adv:fn", "algorithm.gamma=1.0"])
    assert "move it to algorithm.options.gamma" in text


# ---------------------------------------------------------------- a bare name as an override


def test_a_bare_name_override_keeps_the_settings_given_before_it(tmp_path: Path) -> None:
    a = load_config(
        None, ["algorithm.policy_loss.gspo_clip_low=1e-3", "algorithm.policy_loss=gspo"]
    ).algorithm
    assert a.policy_loss == GspoLoss(gspo_clip_low=1e-3)
    path = write(tmp_path, {"policy_loss": {"name": "gspo", "gspo_clip_low": 1e-3}})
    assert load_config(path, ["algorithm.policy_loss=gspo"]).algorithm.policy_loss == GspoLoss(
        gspo_clip_low=1e-3
    )
    assert load_config(path, ["algorithm.policy_loss={name: cispo}"]).algorithm.policy_loss == CispoLoss()
    name_only = write(tmp_path, {"policy_loss": "gspo"})
    assert load_config(name_only, ["algorithm.policy_loss=cispo"]).algorithm.policy_loss == CispoLoss()


def test_a_bare_name_override_that_switches_the_choice_reports_the_settings_left_behind(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, {"policy_loss": {"name": "gspo", "gspo_clip_low": 1e-3}})
    assert refused(["algorithm.policy_loss=cispo"], path) == (
        "algorithm.policy_loss.gspo_clip_low=0.001: only policy_loss=gspo reads it, and this run's "
        "policy_loss is cispo; remove it or set policy_loss: {name: gspo, gspo_clip_low: 0.001}."
    )


# ---------------------------------------------------------------- "did you mean"


def test_a_misspelt_setting_of_another_choice_names_that_choice() -> None:
    assert refused(["algorithm.policy_loss.gspo_clip_lo=1"]) == (
        "unknown key 'algorithm.policy_loss.gspo_clip_lo'; did you mean "
        "'algorithm.policy_loss.gspo_clip_low'? "
        "(a setting of policy_loss=gspo)"
    )
    assert "(it belongs to another section)" in refused(["rollout.clip_ratio_hig=1"])


def test_assignment_checks_options_too() -> None:
    a = AlgorithmConfig(policy_loss=PLUGIN, options={"clip_ratio_low": 0.1})
    with pytest.raises(ValueError, match="a setting of policy_loss=ppo"):
        a.policy_loss = "ppo"  # type: ignore[assignment]
