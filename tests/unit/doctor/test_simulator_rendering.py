"""The doctor's simulator rendering check: found for `gym` configs, ok / warning with the fix from the probe."""

from __future__ import annotations

from ascent.config import RunConfig
from ascent.doctor import model, system


def _cfg(env: str) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"path": "m"},
            "data": {"train_path": "t.jsonl"},
            "rollout": {"source": {"name": "env", "env": env}},
        }
    )


def test_only_simulator_configs_are_probed():
    assert model.simulator_envs(_cfg("gym")) == ["gym"]
    assert model.simulator_envs(_cfg("guess_number")) == []
    assert system.check_simulator_rendering([]).status == "skipped"


def test_a_working_backend_is_ok_and_none_is_a_warning_with_the_fix():
    good = system.check_simulator_rendering(["gym"], probe=lambda: ("egl", "egl: rendered"))
    assert good.status == "ok" and "MUJOCO_GL=egl" in good.detail
    bad = system.check_simulator_rendering(["gym"], probe=lambda: (None, "egl: no display; osmesa: missing"))
    assert bad.status == "warn" and "state-only" in bad.detail and "libosmesa6" in bad.fix
