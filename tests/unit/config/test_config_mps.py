"""cluster.mps=on where no MPS daemon of the run can serve (inline, no GPUs, a joined cluster) is refused at
load time, naming the field, the value and the fix; auto and off load everywhere; `ascent sft` refuses it."""

from __future__ import annotations

import pytest

from ascent.config import ConfigError, SFTConfig, load_config

RAY_GPU = ["cluster.backend=ray", "cluster.gpus_per_worker=1", "cluster.device=cuda"]


def problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return info.value.problems


def test_on_inline_is_refused():
    (only,) = problems(["cluster.mps=on", "cluster.gpus_per_worker=1"])
    assert only.startswith("cluster.mps=on: ") and "backend=inline runs one" in only
    assert "set cluster.backend=ray or cluster.mps=auto" in only


@pytest.mark.parametrize(
    "gpus", [["cluster.device=cpu"], ["cluster.gpus_per_worker=0", "cluster.device=cuda"]]
)
def test_on_without_gpus_is_refused(gpus):
    (only,) = problems(["cluster.mps=on", *RAY_GPU, *gpus])
    assert only.startswith("cluster.mps=on: the workers have no GPUs")
    assert "give them GPUs or set cluster.mps=auto" in only


def test_on_with_a_joined_cluster_is_refused_with_the_per_node_way():
    (only,) = problems(["cluster.mps=on", *RAY_GPU, "cluster.address=10.0.0.1:6379"])
    assert only.startswith("cluster.mps=on: ") and "cluster.address='10.0.0.1:6379'" in only
    assert "nvidia-cuda-mps-control -d" in only and "leave cluster.mps=auto" in only


def test_on_with_ray_gpus_and_auto_or_off_anywhere_load():
    assert load_config(None, ["cluster.mps=on", *RAY_GPU]).cluster.mps == "on"
    assert load_config(None, [*RAY_GPU, "cluster.engine_sleeps=false"]).cluster.mps == "auto"  # the default
    for mps in ("auto", "off"):
        for where in ([], ["cluster.device=cpu"], [*RAY_GPU, "cluster.address=10.0.0.1:6379"]):
            assert load_config(None, [f"cluster.mps={mps}", *where]).cluster.mps == mps


def test_sft_refuses_a_changed_mps():
    with pytest.raises(ValueError, match="cluster.mps='off': `ascent sft` does not read this RL field"):
        SFTConfig.model_validate({"cluster": {"mps": "off"}})
    SFTConfig.model_validate({"cluster": {"mps": "auto"}})  # the default, as a resolved config lists it
