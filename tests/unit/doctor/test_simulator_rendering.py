"""The doctor's simulator rendering check: found for `gym` configs, ok / warning with the fix from the probe."""

from __future__ import annotations

from ascent.config import RunConfig
from ascent.doctor import cluster, model, system


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


def _ray(**rollout) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": {"path": "m"},
            "data": {"train_path": "t.jsonl"},
            "cluster": {"backend": "ray"},
            "rollout": {"source": {"name": "env", "env": "gym", "sims_per_worker": 8}} | rollout,
        }
    )


def test_simulator_placement_reports_workers_per_node_and_per_gpu():
    per_node = cluster.check_simulator_placement(_ray(env_workers_per_node=6), ["gym"], None, 0)
    assert per_node.status == "ok" and "6 per node" in per_node.detail and "8 copies" in per_node.detail
    on_gpu = cluster.check_simulator_placement(_ray(env_gpus=0.25), ["gym"], "egl", 1)
    assert on_gpu.status == "ok" and on_gpu.data["per_gpu"] == 4 and "4 per GPU" in on_gpu.detail
    assert cluster.check_simulator_placement(_cfg("guess_number"), [], None, 0).status == "skipped"


def test_a_gpu_share_without_a_gpu_or_without_egl_fails_with_the_fix():
    no_gpu = cluster.check_simulator_placement(_ray(env_gpus=0.5), ["gym"], "egl", 0)
    assert no_gpu.status == "fail" and "rollout.env_gpus=0" in no_gpu.fix
    osmesa = cluster.check_simulator_placement(_ray(env_gpus=0.5), ["gym"], "osmesa", 2)
    assert osmesa.status == "fail" and "osmesa" in osmesa.detail and "MUJOCO_GL=egl" in osmesa.fix
