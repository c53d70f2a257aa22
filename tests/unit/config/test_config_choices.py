"""The policy loss and the advantage as choices: a name or {name: ..., its own settings}; the older flat
settings lifted into the chosen member; a setting the choice does not read refused with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ascent.cli import app
from ascent.config import ConfigError, RunConfig, dump_config, load_config
from ascent.config.choices import (
    GaeAdvantage,
    GrpoAdvantage,
    GspoLoss,
    PluginChoice,
    PpoLoss,
    RemaxAdvantage,
)
from ascent.config.explain import explain_sections


def write(tmp_path: Path, algorithm: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"algorithm": algorithm}))
    return path


def load(tmp_path: Path, algorithm: dict, overrides: list[str] | None = None) -> RunConfig:
    return load_config(write(tmp_path, algorithm), overrides or [])


def refused(tmp_path: Path, algorithm: dict, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, algorithm, overrides)
    return str(err.value)


def test_a_name_is_its_member_with_defaults(tmp_path: Path) -> None:
    a = load(tmp_path, {"policy_loss": "gspo", "advantage": "remax"}).algorithm
    assert a.policy_loss == GspoLoss(gspo_clip_low=3e-4, gspo_clip_high=4e-4)
    assert a.advantage == RemaxAdvantage(name="remax", gamma=1.0)
    defaults = RunConfig().algorithm
    assert defaults.policy_loss == PpoLoss() and defaults.advantage == GrpoAdvantage()


def test_the_nested_form_sets_the_members_own_fields(tmp_path: Path) -> None:
    a = load(
        tmp_path,
        {"policy_loss": {"name": "gspo", "gspo_clip_low": 0.001}, "advantage": {"name": "gae", "lam": 0.95}},
    ).algorithm
    assert (a.policy_loss.name, a.policy_loss.gspo_clip_low, a.policy_loss.gspo_clip_high) == (
        "gspo",
        0.001,
        4e-4,
    )
    assert a.advantage == GaeAdvantage(gamma=1.0, lam=0.95, gae_whiten=True)


def test_flat_settings_of_older_configs_are_lifted_into_the_chosen_member(tmp_path: Path) -> None:
    """DAPO's clip-higher as the examples write it, and an estimator's settings."""
    a = load(
        tmp_path,
        {"clip_ratio_high": 0.28, "dual_clip_c": 3.0, "advantage": "gae", "gamma": 0.99, "lam": 0.95},
    ).algorithm
    assert a.policy_loss == PpoLoss(clip_ratio_low=0.2, clip_ratio_high=0.28, dual_clip_c=3.0)
    assert a.advantage == GaeAdvantage(gamma=0.99, lam=0.95)
    same = load(tmp_path, {"policy_loss": {"name": "ppo", "clip_ratio_high": 0.28}, "clip_ratio_high": 0.28})
    assert same.algorithm.policy_loss.clip_ratio_high == 0.28  # flat and nested agreeing is fine


def test_a_setting_the_chosen_choice_does_not_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    assert refused(tmp_path, {"gspo_clip_low": 0.001}) == (
        "algorithm.gspo_clip_low=0.001: only policy_loss=gspo reads it, and this run's policy_loss is ppo; "
        "remove it or set policy_loss: {name: gspo, gspo_clip_low: 0.001}."
    )
    text = refused(tmp_path, {"gamma": 0.9, "scale_by_std": False, "advantage": "rloo"})
    assert (
        "algorithm.gamma=0.9: only advantage=reinforce_pp, reinforce_pp_baseline, remax or gae reads it"
        in text
    )
    assert (
        "algorithm.scale_by_std=false: only advantage=grpo or grpo_passk reads it, and this run's advantage "
        "is rloo" in text
    )
    text = refused(tmp_path, {"policy_loss": {"name": "gspo", "clip_ratio_high": 0.28}})
    assert text.startswith(
        "algorithm.policy_loss.clip_ratio_high=0.28: only policy_loss=ppo or clip_cov reads it"
    )


def test_a_flat_setting_at_its_default_passes_for_older_resolved_configs(tmp_path: Path) -> None:
    """An older run's config.yaml lists every loss's settings at their defaults; it still loads."""
    a = load(
        tmp_path, {"policy_loss": "gspo", "clip_ratio_low": 0.2, "dual_clip_c": None, "gamma": 1.0}
    ).algorithm
    assert a.policy_loss == GspoLoss()


def test_flat_and_nested_values_that_differ_are_refused(tmp_path: Path) -> None:
    text = refused(
        tmp_path, {"policy_loss": {"name": "ppo", "clip_ratio_high": 0.3}, "clip_ratio_high": 0.28}
    )
    assert text == (
        "algorithm.clip_ratio_high=0.28 and algorithm.policy_loss.clip_ratio_high=0.3: two values for one "
        "setting; keep only algorithm.policy_loss.clip_ratio_high."
    )


def test_an_unknown_name_lists_the_choices(tmp_path: Path) -> None:
    assert refused(tmp_path, {"policy_loss": "ppo2"}) == (
        "algorithm.policy_loss='ppo2': unknown; use one of cispo, clip_cov, dro, gmpo, gspo, kl_cov, ppo, "
        "reinforce, sapo (or an import path `pkg.module:function`)."
    )
    assert "algorithm.policy_loss=5: must be one of ppo, gspo" in refused(tmp_path, {"policy_loss": 5})


def test_a_plugin_takes_its_settings_from_options(tmp_path: Path) -> None:
    a = load(tmp_path, {"policy_loss": "mypkg.losses:my_loss", "options": {"my_temp": 0.7}}).algorithm
    assert a.policy_loss == PluginChoice(name="mypkg.losses:my_loss")
    assert a.settings_for(a.policy_loss)["my_temp"] == 0.7
    assert "clip_ratio_low" not in a.settings_for(a.policy_loss)
    text = refused(tmp_path, {"policy_loss": {"name": "mypkg.losses:my_loss", "my_temp": 0.7}})
    assert text == (
        "algorithm.policy_loss.my_temp=0.7: a plug-in's settings go under algorithm.options; move it to "
        "algorithm.options.my_temp."
    )
    text = refused(tmp_path, {"policy_loss": "mypkg.losses:my_loss", "clip_ratio_high": 0.28})
    assert "the plug-in 'mypkg.losses:my_loss', whose settings go under algorithm.options" in text


def test_dotted_overrides_reach_the_member(tmp_path: Path) -> None:
    a = load(tmp_path, {"policy_loss": "gspo"}, ["algorithm.policy_loss.gspo_clip_low=1e-3"]).algorithm
    assert a.policy_loss == GspoLoss(gspo_clip_low=1e-3)
    a = load_config(None, ["algorithm.clip_ratio_high=0.28"]).algorithm  # the flat key, on the default ppo
    assert a.policy_loss == PpoLoss(clip_ratio_high=0.28)
    a = load_config(None, ["algorithm.advantage.lam=0.9", "algorithm.advantage.name=gae"]).algorithm
    assert a.advantage == GaeAdvantage(lam=0.9)
    with pytest.raises(ConfigError, match=r"algorithm\.policy_loss\.gspo_clip_low=-1: must be > 0 \(GSPO"):
        load_config(None, ["algorithm.policy_loss=gspo", "algorithm.policy_loss.gspo_clip_low=-1"])
    with pytest.raises(ConfigError, match="did you mean 'algorithm.policy_loss.gspo_clip_low'"):
        load_config(None, ["algorithm.policy_loss=gspo", "algorithm.policy_loss.gspo_clip_lo=1"])
    with pytest.raises(ConfigError, match="did you mean 'algorithm.policy_loss.gspo_clip_low'"):
        load_config(None, ["algorithm.gspo_clip_lo=1"])


def test_the_resolved_config_round_trips_in_the_nested_form(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"policy_loss": "cispo", "advantage": "gae", "lam": 0.95})
    data = yaml.safe_load(dump_config(cfg))["algorithm"]
    assert data["policy_loss"] == {"name": "cispo", "cispo_eps_low": 1.0, "cispo_eps_high": 0.28}
    assert data["advantage"] == {
        "name": "gae",
        "gamma": 1.0,
        "lam": 0.95,
        "gae_whiten": True,
        "shift_mean": True,
    }
    assert "gspo_clip_low" not in data and "clip_ratio_low" not in data
    (tmp_path / "again.yaml").write_text(dump_config(cfg))
    assert load_config(tmp_path / "again.yaml", []) == cfg


def test_explain_lists_the_chosen_members_fields_only(tmp_path: Path) -> None:
    rows = {
        r.name: r
        for r in explain_sections(load(tmp_path, {"policy_loss": {"name": "gspo", "gspo_clip_low": 1e-3}}))[
            "algorithm"
        ]
    }
    assert {"policy_loss.name", "policy_loss.gspo_clip_low", "policy_loss.gspo_clip_high"} <= set(rows)
    assert not any(n.startswith("policy_loss.clip") or n.startswith("policy_loss.sapo") for n in rows)
    low = rows["policy_loss.gspo_clip_low"]
    assert (low.value, low.default, low.changed) == (1e-3, 3e-4, True)
    assert low.description == "GSPO: sequence ratio >= 1 - gspo_clip_low."
    assert rows["policy_loss.name"].default == "ppo" and {"advantage.scale_by_std", "adv_eps"} <= set(rows)


def test_config_show_lists_the_member_fields_and_refuses_an_unread_one(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["config", "show", "algorithm.policy_loss=sapo", "--explain"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "policy_loss.sapo_tau_neg" in result.stdout and "clip_ratio_low" not in result.stdout
    result = runner.invoke(app, ["config", "show", str(write(tmp_path, {"gspo_clip_low": 0.001}))])
    assert result.exit_code == 2
    assert "algorithm.gspo_clip_low=0.001: only policy_loss=gspo reads it" in result.output


def test_assigning_a_choice_by_name_leaves_the_other_as_it_was() -> None:
    cfg = RunConfig(algorithm={"advantage": {"name": "gae", "lam": 0.9}})
    cfg.algorithm.policy_loss = "gspo"  # type: ignore[assignment]
    assert cfg.algorithm.policy_loss == GspoLoss() and cfg.algorithm.advantage == GaeAdvantage(lam=0.9)


def test_the_issue_30_choices_load_with_their_own_settings(tmp_path: Path) -> None:
    a = load(
        tmp_path,
        {"policy_loss": {"name": "clip_cov", "clip_cov_ratio": 0.001}, "advantage": "gpg"},
        ["algorithm.loss_aggregation=token-sum"],
    ).algorithm
    assert (a.policy_loss.name, a.policy_loss.clip_cov_ratio, a.policy_loss.clip_ratio_high) == (
        "clip_cov",
        1e-3,
        0.2,
    )
    assert (a.advantage.name, a.loss_aggregation) == ("gpg", "token-sum")
    a = load(tmp_path, {"policy_loss": "gmpo", "advantage": {"name": "passk", "pass_k": 8}}).algorithm
    assert (a.policy_loss.gmpo_clip_low, a.advantage.pass_k) == (0.4, 8)
    a = load(tmp_path, {"advantage": "reinforce_pp", "shift_mean": False}).algorithm  # the flat form lifts
    assert a.advantage.shift_mean is False
    text = refused(tmp_path, {"policy_loss": {"name": "clip_cov", "clip_cov_lb": 5.0, "clip_cov_ub": 1.0}})
    assert "clip_cov_lb=5.0 must be below clip_cov_ub=1.0" in text
    text = refused(tmp_path, {"advantage": "remax", "shift_mean": False})
    assert "only advantage=reinforce_pp, reinforce_pp_baseline or gae reads it" in text
